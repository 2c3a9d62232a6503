import Foundation
import GRDB
import Synchronization
import Testing

@testable import Tandem

@Suite("The local change observer")
struct LocalChangeObserverTests {
    /// Every commit of the app reaches the push through the observer's stored action. Stored
    /// as the `Mutex`'s own generic value, the closure came back from each `withLock` wrapped
    /// in a pair of conversion thunks more (swiftlang/swift#91348): the call went deeper at
    /// every commit, without end. Without the fix, 47 return addresses at the first commit and
    /// by the 300th the 128 that `callStackReturnAddresses` reports at most on Linux.
    @Test("a commit's notice takes as many frames at the 300th commit as at the first")
    func noticeDoesNotDeepen() throws {
        let database = try DatabaseQueue()
        try database.write { db in try db.execute(sql: "CREATE TABLE item (id INTEGER PRIMARY KEY, title TEXT)") }
        let observer = LocalChangeObserver(tables: ["item"], parents: [])
        let depths = Mutex<[Int]>([])
        observer.setOnCommit { _ in
            let depth = Thread.callStackReturnAddresses.count
            depths.withLock { $0.append(depth) }
        }
        database.add(transactionObserver: observer, extent: .observerLifetime)
        for index in 0..<300 {
            try database.write { db in
                try db.execute(sql: "INSERT INTO item (title) VALUES (?)", arguments: ["\(index)"])
            }
        }
        let seen = depths.withLock { $0 }
        #expect(seen.count == 300)
        let first = try #require(seen.first)
        try #require(first < 100, "the first notice is \(first) frames deep: no room below the cap to see growth")
        // Two frames more per commit, without the fix: far beyond a few frames of difference.
        #expect(seen.max()! - first < 8, "the notice went \(seen.max()! - first) frames deeper")
    }
}
