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

    @Test(
        "listener names: the path first, a new name each time a collection is listened to again, none longer than a label may be, no two alike"
    )
    func listenerNames() throws {
        var listeners = Listeners()
        let entries = try CollectionPath("accounts/a1/entries")
        let long = try CollectionPath(
            String(repeating: "a", count: 60) + "/" + String(repeating: "b", count: 20) + "/"
                + String(repeating: "e", count: 60))
        let target = ListenerTarget(table: "entry", parentRowId: 1)
        var names: [String] = []
        for (path, first) in [(entries, true), (long, true), (entries, false), (long, false), (entries, false)] {
            let name = listeners.opening(path, target)
            #expect(name.isFirst == first)
            #expect(name.text.utf8.count <= Wire.maxLabelBytes, "\(name.text)")
            #expect(listeners.open[path]?.name == name.text)
            names.append(name.text)
        }
        #expect(names[0] == "accounts/a1/entries" && names[2] == "accounts/a1/entries#1")
        #expect(names[1].hasPrefix("#2:") && names[1].hasSuffix("/" + String(repeating: "e", count: 60)))
        #expect(Set(names).count == names.count, "\(names)")
    }

    @Test(
        "reset window: a full snapshot's end keeps the rows acknowledged after it was read (its last page, a view's first frame); nothing is kept while none is coming"
    )
    func resetWindow() throws {
        let (accounts, shared) = (try CollectionPath("accounts"), try CollectionPath("shared"))
        var window = ResetWindow()
        window.acknowledged([1, 2], of: "account", arrival: 5)
        func kept(_ table: String, _ path: CollectionPath, lastPage: Int, view: Bool = false) -> Set<Int64> {
            window.rows(of: table, in: path, lastPage: lastPage, readAtFirstFrame: view)
        }
        #expect(kept("account", accounts, lastPage: 0).isEmpty, "kept with no reset under way")

        window.expect(accounts, since: 5, isView: false)
        window.expect(shared, since: 5, isView: true)
        window.received(initialFrameOf: shared, arrival: 6)
        window.received(initialFrameOf: shared, arrival: 8)  // not the first
        window.acknowledged([3], of: "account", arrival: 7)
        window.acknowledged([4, 5], of: "account", arrival: 9)
        window.acknowledged([6], of: "note", arrival: 9)
        window.acknowledged([], of: "account", arrival: 10)
        #expect(kept("account", accounts, lastPage: 6) == [3, 4, 5])
        #expect(kept("account", accounts, lastPage: 7) == [4, 5], "an answer before the page is in it")
        #expect(kept("account", accounts, lastPage: 9).isEmpty)
        #expect(kept("note", shared, lastPage: 11, view: true) == [6], "a view is read before its first frame")
        #expect(kept("note", shared, lastPage: 11).isEmpty)

        // Taken through message 8: the answer numbered 7 came after the view's first frame
        // (6), whose last page is still to come.
        window.taken(through: 8, finished: [(accounts, 8)])
        #expect(kept("account", shared, lastPage: 8, view: true) == [3, 4, 5])
        window.received(initialFrameOf: shared, arrival: 12)
        window.taken(through: 12, finished: [])
        #expect(kept("note", shared, lastPage: 12, view: true) == [6], "the first frame stands")

        // The server starts the view over (a reset, message 13) before the old round's last
        // page (12) is applied: that page keeps every row noted, and does not end the new round.
        window.expect(shared, since: 13, isView: true)
        #expect(kept("account", shared, lastPage: 12, view: true) == [3, 4, 5])
        window.taken(through: 12, finished: [(shared, 12)])
        #expect(!window.isEmpty, "the new round is still coming")
        window.received(initialFrameOf: shared, arrival: 14)
        window.acknowledged([7], of: "account", arrival: 15)
        #expect(kept("account", shared, lastPage: 16, view: true) == [7])

        // The view's listener was refused (message 17) after its last page (16) came, before
        // that page is applied: the page still keeps what came after its first frame.
        window.close(shared, at: 17)
        #expect(kept("account", shared, lastPage: 16, view: true) == [7])
        window.taken(through: 17, finished: [(shared, 16)])
        #expect(window.isEmpty, "nothing is coming any more")
        window.expect(shared, since: 20, isView: true)
        #expect(kept("account", shared, lastPage: 21).isEmpty, "forgotten once no full snapshot is coming")
        window.close(shared, at: 20)
        window.taken(through: 20, finished: [])
        #expect(window.isEmpty, "a closed round goes once what came before its close is taken")

        // A collection's long full snapshot keeps only the answers after its pages taken.
        window.expect(accounts, since: 22, isView: false)
        window.received(initialFrameOf: accounts, arrival: 23)
        window.acknowledged([8], of: "account", arrival: 24)
        window.acknowledged([9], of: "account", arrival: 26)
        window.taken(through: 25, finished: [])
        #expect(window.notedCount == 1)
        #expect(kept("account", accounts, lastPage: 25) == [9])
        window.taken(through: 27, finished: [(accounts, 27)])
        #expect(window.isEmpty)

        // A view overtaken by a new reset (message 33) while its last page (32) waits behind
        // a message taken first (31): the answer after its first frame (30) stays for it.
        window.expect(shared, since: 28, isView: true)
        window.received(initialFrameOf: shared, arrival: 29)
        window.acknowledged([10], of: "note", arrival: 30)
        window.expect(shared, since: 33, isView: true)
        window.taken(through: 31, finished: [])
        #expect(kept("note", shared, lastPage: 32, view: true) == [10], "the overtaken view's last page keeps it")
        window.taken(through: 32, finished: [(shared, 32)])
        #expect(window.notedCount == 0, "kept no longer once that page was taken")
    }

    @Test("three-way merge: a field changed on one side takes that side, whatever the clocks say")
    func threeWayOneSided() {
        let base: JSONObject = ["title": "Rent", "amount": -100, "updatedAt": 1]
        // The local side changed the title, the remote side the amount. The times would favour
        // the remote title (9 > 2), but the remote never changed it.
        let merged = ThreeWayMerge.merge(
            base: base,
            local: (["title": "Rent (May)", "amount": -100, "updatedAt": 2], ["title": 2, "amount": 1]),
            remote: (["title": "Rent", "amount": -120, "updatedAt": 9], ["title": 9, "amount": 9]))
        #expect(merged.fields["title"] == "Rent (May)")
        #expect(merged.fields["amount"] == -120)
        #expect(merged.inConflict.isEmpty)
        #expect(merged.fields["updatedAt"] == 9)
    }

    @Test("three-way merge: a field changed on both sides takes the later write")
    func threeWayBothSides() {
        let base: JSONObject = ["title": "Rent"]
        let later = ThreeWayMerge.merge(
            base: base, local: (["title": "Local"], ["title": 5]), remote: (["title": "Remote"], ["title": 4]))
        #expect(later.fields["title"] == "Local")
        #expect(later.inConflict == ["title"])
        let earlier = ThreeWayMerge.merge(
            base: base, local: (["title": "Local"], ["title": 3]), remote: (["title": "Remote"], ["title": 4]))
        #expect(earlier.fields["title"] == "Remote")
    }

    @Test("hybrid logical clock: monotonic, and past every timestamp received")
    func hybridLogicalClock() {
        let clock = HybridLogicalClock(wall: FixedClock(time: 1000))
        let a = clock.now()
        let b = clock.now()
        #expect(b > a, "monotonic within one millisecond")
        let fromTheFuture = HybridLogicalClock.timestamp(milliseconds: 1000 + 3_600_000)
        clock.receive(fromTheFuture)
        let c = clock.now()
        #expect(c > fromTheFuture, "a later local event comes after what it has seen")
        #expect(HybridLogicalClock.milliseconds(c) == 1000 + 3_600_000)
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

struct FixedClock: SyncClock {
    var time: Int64
    func now() -> Int64 { time }
}
