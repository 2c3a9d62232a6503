import Foundation
import GRDB
import Synchronization
import TandemTesting
import Testing

@testable import Tandem

@Suite("The local change observer")
struct LocalChangeObserverTests {
    /// Every commit of the app reaches the push through the observer's stored action. Stored
    /// as the `Mutex`'s own generic value, the closure came back from each `withLock` wrapped
    /// in one more conversion thunk: the call went deeper at every commit, without end (here,
    /// without the fix, 47 return addresses at the first commit and the 128 that
    /// `callStackReturnAddresses` reports at most by the 2,000th).
    @Test("a commit's notice takes as many frames at the 2,000th commit as at the first")
    func noticeDoesNotDeepen() throws {
        let folder = try TemporaryDirectory()
        let database = try DatabaseQueue(path: folder.path("app.sqlite"))
        try database.write { db in try db.execute(sql: "CREATE TABLE item (id INTEGER PRIMARY KEY, title TEXT)") }
        let observer = LocalChangeObserver(tables: ["item"], parents: [])
        let depths = Mutex<[Int]>([])
        observer.setOnCommit { _ in
            let depth = Thread.callStackReturnAddresses.count
            depths.withLock { $0.append(depth) }
        }
        database.add(transactionObserver: observer, extent: .observerLifetime)
        for index in 0..<2_000 {
            try database.write { db in
                try db.execute(sql: "INSERT INTO item (title) VALUES (?)", arguments: ["\(index)"])
            }
        }
        let seen = depths.withLock { $0 }
        #expect(seen.count == 2_000)
        #expect(seen.last == seen.first, "the notice went \((seen.last ?? 0) - (seen.first ?? 0)) frames deeper")
    }
}
