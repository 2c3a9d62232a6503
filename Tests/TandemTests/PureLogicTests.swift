import Foundation
import GRDB
import Testing

@testable import Tandem
@testable import TandemWire

@Suite("Pure parts of the engine")
struct PureLogicTests {
    @Test("backoff doubles up to the cap, with jitter between half and all of the delay")
    func backoff() {
        let backoff = Backoff(initial: .milliseconds(100), cap: .seconds(5))
        #expect(backoff.delay(attempt: 0, random: 1) == .milliseconds(100))
        #expect(backoff.delay(attempt: 0, random: 0) == .milliseconds(50))
        #expect(backoff.delay(attempt: 3, random: 1) == .milliseconds(800))
        #expect(backoff.delay(attempt: 30, random: 1) == .seconds(5))
        #expect(backoff.delay(attempt: 30, random: 0) == .milliseconds(2500))
    }

    @Test("last write wins: the later updatedAt wins; a tie goes to the server's version")
    func lastWriteWins() throws {
        let remote = Document(
            id: try DocumentID("x"), version: 4, fields: ["updatedAt": 2000], createTime: 0, updateTime: 9)
        let policy = ConflictPolicy.lastWriteWins
        #expect(policy.resolve(Conflict(localUpdatedAt: 2001, remote: remote)) == .keepLocal)
        #expect(policy.resolve(Conflict(localUpdatedAt: 1999, remote: remote)) == .takeRemote)
        #expect(policy.resolve(Conflict(localUpdatedAt: 2000, remote: remote)) == .takeRemote)
    }

    @Test(
        "column values survive the trip to JSON and back",
        arguments: [
            DatabaseValue.null, 42.databaseValue, (-7.25).databaseValue, "text".databaseValue,
            Data([0, 1, 2, 255]).databaseValue,
        ])
    func fieldCoding(value: DatabaseValue) {
        #expect(FieldCoding.database(FieldCoding.json(value)) == value)
    }

    @Test("SQL identifiers and literals are quoted")
    func quoting() {
        #expect(SQL.quote("transaction") == "\"transaction\"")
        #expect(SQL.quote("we\"ird") == "\"we\"\"ird\"")
        #expect(SQL.literal("it's") == "'it''s'")
    }
}
