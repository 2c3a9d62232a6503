import Foundation
import Synchronization
import TandemClient
import TandemServer
import TandemTesting
import TandemWire
import Testing

@Suite("Listeners: snapshots, live changes and resume")
struct FeedTests {
    @Test("a listener gets the initial snapshot, then live adds, modifications and deletes in commit order")
    func liveFeed() async throws {
        let server = try await TestServer()
        let writer = try await connect(server)
        let a = try await writer.create("notes", ["title": "a"])
        let b = try await writer.create("notes", ["title": "b"])

        let reader = try await connect(server)
        let feed = Feed()
        reader.listen(to: try path("notes"), handler: feed.handler)
        try await waitUntil("the initial snapshot arrives") { feed.isCurrent }
        #expect(feed.summary == ["added \(a.id) v1", "added \(b.id) v1"])
        #expect(feed.changes.map { $0.document.fields["title"] } == ["a", "b"])

        _ = try await writer.update("notes", a.id, ["title": "a2"], base: 1)
        let c = try await writer.create("notes", ["title": "c"])
        _ = try await writer.delete("notes", b.id, base: 1)
        try await waitUntil("three live changes arrive") { feed.changes.count == 5 }
        #expect(
            feed.summary.suffix(3) == ["modified \(a.id) v2", "added \(c.id) v1", "deleted \(b.id) v2"])
        #expect(feed.changes[2].document.fields == ["title": "a2"])
        #expect(feed.changes[4].document.deleted)
        let live = feed.snapshots.dropFirst()
        #expect(live.allSatisfy { !$0.initial })
        let sequences = feed.snapshots.compactMap { ResumeToken($0.resumeToken)?.sequence }
        #expect(sequences == sequences.sorted())
    }

    @Test("a listener on an empty collection is current at once")
    func emptyCollection() async throws {
        let server = try await TestServer()
        let reader = try await connect(server)
        let feed = Feed()
        reader.listen(to: try path("nothing/here/yet"), handler: feed.handler)
        try await waitUntil("current") { feed.isCurrent }
        #expect(feed.changes.isEmpty)
    }

    @Test("a reconnecting listener receives only what changed after its token, typed added, modified or deleted")
    func resume() async throws {
        let server = try await TestServer()
        let writer = try await connect(server)
        let a = try await writer.create("notes", ["title": "a"])
        let b = try await writer.create("notes", ["title": "b"])

        let first = try await connect(server)
        let feed = Feed()
        first.listen(to: try path("notes"), handler: feed.handler)
        try await waitUntil("current") { feed.isCurrent }
        let token = try #require(feed.lastToken)
        first.close()

        _ = try await writer.update("notes", a.id, ["title": "a2"], base: 1)
        let c = try await writer.create("notes", ["title": "c"])
        _ = try await writer.delete("notes", b.id)
        let d = try await writer.create("notes", ["title": "short-lived"])
        _ = try await writer.delete("notes", d.id)

        let again = try await connect(server)
        let resumed = Feed()
        again.listen(to: try path("notes"), resumeToken: token, handler: resumed.handler)
        try await waitUntil("current") { resumed.isCurrent }
        #expect(resumed.summary == ["modified \(a.id) v2", "added \(c.id) v1", "deleted \(b.id) v2"])
        #expect(resumed.resets.isEmpty)

        // Resuming from the newest token brings nothing.
        let third = Feed()
        again.listen(to: try path("notes"), target: "second", resumeToken: resumed.lastToken, handler: third.handler)
        try await waitUntil("current") { third.isCurrent }
        #expect(third.changes.isEmpty)
    }

    @Test("a token older than the tombstone horizon gets reset, then the full snapshot")
    func horizonReset() async throws {
        let clock = ManualServerClock()
        let server = try await TestServer { configuration in
            configuration.clock = clock.read
            configuration.tombstoneRetention = .seconds(3600)
        }
        let writer = try await connect(server)
        let a = try await writer.create("notes", ["title": "a"])
        let b = try await writer.create("notes", ["title": "b"])
        let reader = try await connect(server)
        let feed = Feed()
        reader.listen(to: try path("notes"), handler: feed.handler)
        try await waitUntil("current") { feed.isCurrent }
        let token = try #require(feed.lastToken)
        reader.close()

        _ = try await writer.delete("notes", b.id)
        clock.advance(by: 2 * 3600 * 1000)
        #expect(await server.server.purgeExpired().tombstones == 1)

        let again = try await connect(server)
        let resumed = Feed()
        again.listen(to: try path("notes"), resumeToken: token, handler: resumed.handler)
        try await waitUntil("current") { resumed.isCurrent }
        #expect(resumed.resets.count == 1)
        #expect(resumed.resets.first?.contains("purged") == true)
        #expect(resumed.summary == ["added \(a.id) v1"])
        #expect(resumed.snapshots.allSatisfy { $0.initial })
    }

    @Test("a new listener catches up page by page past a purge horizon left from before, without a reset")
    func catchUpPastOldHorizon() async throws {
        let clock = ManualServerClock()
        let server = try await TestServer { configuration in
            configuration.clock = clock.read
            configuration.tombstoneRetention = .seconds(3600)
            configuration.snapshotPageSize = 2
        }
        let writer = try await connect(server)
        var ids: [DocumentID] = []
        for n in 0..<5 { ids.append(try await writer.create("notes", ["n": .int(Int64(n))]).id) }
        _ = try await writer.delete("notes", ids[4])
        clock.advance(by: 2 * 3600 * 1000)
        #expect(await server.server.purgeExpired().tombstones == 1)  // the horizon is now past every live document

        let reader = try await connect(server)
        let feed = Feed()
        reader.listen(to: try path("notes"), handler: feed.handler)
        try await waitUntil("current") { feed.isCurrent }
        #expect(feed.resets.isEmpty)
        #expect(feed.summary == ids.prefix(4).map { "added \($0) v1" })
    }

    @Test("a token from another database gets reset")
    func foreignToken() async throws {
        let server = try await TestServer()
        let writer = try await connect(server)
        _ = try await writer.create("notes", ["title": "a"])
        let feed = Feed()
        writer.listen(to: try path("notes"), resumeToken: "SomeOtherDB.1", handler: feed.handler)
        try await waitUntil("current") { feed.isCurrent }
        #expect(feed.resets.count == 1)
        #expect(feed.changes.count == 1)
    }

    @Test("a large collection arrives in pages that the client can resume between")
    func paging() async throws {
        let server = try await TestServer { configuration in
            configuration.snapshotPageSize = 100
        }
        let writer = try await connect(server)
        for batch in 0..<10 {
            let ops = try (0..<100).map { index in
                WriteOp.create(
                    in: try path("items"), fields: ["n": .int(Int64(batch * 100 + index))], idempotencyKey: key())
            }
            guard case .ack = try await writer.write(ops) else { throw TestFailure("batch refused") }
        }
        let reader = try await connect(server)
        let feed = Feed()
        reader.listen(to: try path("items"), handler: feed.handler)
        try await waitUntil("current") { feed.isCurrent }
        #expect(feed.changes.count == 1000)
        #expect(feed.snapshots.count == 10)
        #expect(feed.snapshots.dropLast().allSatisfy { $0.hasMore && $0.initial })
        #expect(Set(feed.changes.map(\.document.id)).count == 1000)

        // Resuming from the token of page 3 gives exactly the documents after it.
        let middle = feed.snapshots[2].resumeToken
        let resumed = Feed()
        reader.listen(to: try path("items"), target: "again", resumeToken: middle, handler: resumed.handler)
        try await waitUntil("current") { resumed.isCurrent }
        #expect(resumed.changes.map(\.document.id) == feed.changes.dropFirst(300).map(\.document.id))
    }

    @Test("changes written during the initial load reach the listener exactly once, in order")
    func writesDuringCatchUp() async throws {
        let server = try await TestServer { configuration in
            configuration.snapshotPageSize = 50
        }
        let writer = try await connect(server)
        let ops = try (0..<400).map { index in
            WriteOp.create(in: try path("items"), fields: ["n": .int(Int64(index))], idempotencyKey: key())
        }
        _ = try await writer.write(ops)
        let reader = try await connect(server)
        let feed = Feed()
        reader.listen(to: try path("items"), handler: feed.handler)
        for index in 0..<50 { _ = try await writer.create("items", ["late": .int(Int64(index))]) }
        try await waitUntil("all 450 seen") { Set(feed.changes.map(\.document.id)).count == 450 }
        try await waitUntil("current") { feed.isCurrent }
        let sequences = feed.snapshots.compactMap { ResumeToken($0.resumeToken)?.sequence }
        #expect(sequences == sequences.sorted())
        #expect(try await server.server.documents(in: try path("items")).count == 450)
    }

    @Test("fifty listeners on one collection all receive every change, in order")
    func fanOut() async throws {
        let server = try await TestServer()
        let writer = try await connect(server)
        var feeds: [Feed] = []
        var readers: [ServerConnection] = []
        for _ in 0..<50 {
            let reader = try await connect(server)
            let feed = Feed()
            reader.listen(to: try path("shared"), handler: feed.handler)
            feeds.append(feed)
            readers.append(reader)
        }
        try await waitUntil("all current") { feeds.allSatisfy(\.isCurrent) }

        var expected: [String] = []
        for index in 0..<10 {
            let created = try await writer.create("shared", ["n": .int(Int64(index))])
            expected.append("added \(created.id) v1")
            if index % 3 == 0 {
                _ = try await writer.update("shared", created.id, ["n": .int(Int64(-index))], base: 1)
                expected.append("modified \(created.id) v2")
            }
        }
        try await waitUntil("every listener has every change") {
            feeds.allSatisfy { $0.changes.count == expected.count }
        }
        for feed in feeds { #expect(feed.summary == expected) }
        #expect(await server.server.stats.liveListeners == 50)
    }

    @Test("unlisten stops the changes of that target only")
    func unlisten() async throws {
        let server = try await TestServer()
        let connection = try await connect(server)
        let kept = Feed(), dropped = Feed()
        connection.listen(to: try path("a"), target: "kept", handler: kept.handler)
        connection.listen(to: try path("a"), target: "dropped", handler: dropped.handler)
        try await waitUntil("current") { kept.isCurrent && dropped.isCurrent }
        connection.unlisten("dropped")
        _ = try await connection.create("a", ["x": 1])
        try await waitUntil("kept hears it") { kept.changes.count == 1 }
        #expect(dropped.changes.isEmpty)
        try await waitUntil("the server forgot the listener") { await server.server.stats.listeners == 1 }
    }

    @Test("a connection may not hold more listeners than the limit")
    func tooManyListeners() async throws {
        let server = try await TestServer { $0.limits.maxListenersPerConnection = 2 }
        let connection = try await connect(server)
        let feeds = [Feed(), Feed(), Feed()]
        for (index, feed) in feeds.enumerated() {
            connection.listen(to: try path("c\(index)"), handler: feed.handler)
        }
        try await waitUntil("the third is refused") { feeds[2].errors.count == 1 }
        #expect(feeds[2].errors.first?.code == .tooManyListeners)
        #expect(feeds[0].isCurrent && feeds[1].isCurrent)
    }
}

@Suite("Resume after one's own create")
struct OwnCreateResumeTests {
    @Test("a client resuming from a token older than its own create hears of that document's delete")
    func deleteOfOwnCreate() async throws {
        let server = try await TestServer()
        let creator = try await connect(server, as: "creator")
        let feed = Feed()
        creator.listen(to: try path("notes"), handler: feed.handler)
        try await waitUntil("current") { feed.isCurrent }
        let token = try #require(feed.lastToken)
        creator.close()

        // The creator learns the id from its ack, but goes away before the echo is stored.
        let again = try await connect(server, as: "creator")
        let mine = try await again.create("notes", ["t": "mine"])
        again.close()
        let other = try await connect(server, as: "other")
        let theirs = try await other.create("notes", ["t": "theirs"])
        _ = try await other.delete("notes", mine.id)
        _ = try await other.delete("notes", theirs.id)

        let resumed = try await connect(server, as: "creator")
        let resumedFeed = Feed()
        resumed.listen(to: try path("notes"), resumeToken: token, handler: resumedFeed.handler)
        try await waitUntil("current") { resumedFeed.isCurrent }
        #expect(resumedFeed.summary == ["deleted \(mine.id) v2"], "its own document's delete, not the other one's")
    }
}

@Suite("Listeners that leave out their own writes")
struct ExcludeOwnWritesTests {
    @Test(
        "excludeOwnWrites: the writing connection gets the new resume token without its own changes; others, and its listeners without the flag, get them; another writer's later write reaches it"
    )
    func ownWritesLeftOut() async throws {
        let server = try await TestServer()
        let writer = try await connect(server, as: "writer")
        let own = Feed()
        let plain = Feed()
        writer.listen(to: try path("notes"), target: "own", excludingOwnWrites: true, handler: own.handler)
        writer.listen(to: try path("notes"), target: "plain", handler: plain.handler)
        let other = try await connect(server, as: "other")
        let theirs = Feed()
        other.listen(to: try path("notes"), excludingOwnWrites: true, handler: theirs.handler)
        try await waitUntil("all current") { own.isCurrent && plain.isCurrent && theirs.isCurrent }

        let a = try await writer.create("notes", ["t": "a"])
        try await waitUntil("the change reaches the others") {
            plain.changes.count == 1 && theirs.changes.count == 1 && own.snapshots.count == 2
        }
        let tokenOnly = try #require(own.snapshots.last)
        #expect(tokenOnly.changes.isEmpty && !tokenOnly.initial, "the token alone: \(tokenOnly)")
        #expect(tokenOnly.resumeToken == plain.lastToken)
        #expect(theirs.summary == ["added \(a.id) v1"])

        // The writer's update is left out for it; the other connection's later one reaches it
        // (and the other hears the writer's).
        _ = try await writer.update("notes", a.id, ["t": "a2"], base: 1)
        _ = try await other.update("notes", a.id, ["t": "a3"], base: 2)
        try await waitUntil("the other's update reaches the writer") { own.summary.contains("modified \(a.id) v3") }
        #expect(!own.summary.contains("modified \(a.id) v2"))
        #expect(theirs.summary.last == "modified \(a.id) v2", "the other connection hears the writer's update")
        #expect(own.changes.last?.document.fields == ["t": "a3"])
        try await waitUntil("the plain listener heard both") { plain.changes.count == 3 }

        // A new connection of the same client resumes and hears what it wrote before.
        let token = try #require(own.snapshots.first?.resumeToken)
        writer.close()
        let again = try await connect(server, as: "writer")
        let resumed = Feed()
        again.listen(to: try path("notes"), resumeToken: token, excludingOwnWrites: true, handler: resumed.handler)
        try await waitUntil("resumed") { resumed.isCurrent }
        #expect(resumed.summary == ["added \(a.id) v3"])
    }

    @Test(
        "excludeOwnWrites leaves out a write delivered in two pages, not the writer's deletes: their tombstones come, that of a create and delete in one write too"
    )
    func longWritesLeftOutDeletesNot() async throws {
        // Pages of two rows: a write of three documents is one commit delivered in two pages.
        let server = try await TestServer { $0.snapshotPageSize = 2 }
        let writer = try await connect(server, as: "writer")
        let own = Feed()
        writer.listen(to: try path("notes"), excludingOwnWrites: true, handler: own.handler)
        let other = try await connect(server, as: "other")
        let theirs = Feed()
        other.listen(to: try path("notes"), handler: theirs.handler)
        try await waitUntil("both current") { own.isCurrent && theirs.isCurrent }

        let notes = try path("notes")
        let three = try await writer.write(
            (0..<3).map { n in .create(in: notes, fields: ["n": .int(Int64(n))], idempotencyKey: key()) })
        guard case .ack(let created) = three else { throw TestFailure("the three creates were refused: \(three)") }
        _ = try await writer.delete("notes", created[0].id, base: 1)
        let brief = DocumentID.random()
        let both = try await writer.write([
            .create(in: notes, id: brief, fields: ["t": "brief"], idempotencyKey: key()),
            .delete(in: notes, id: brief, baseVersion: nil, idempotencyKey: key()),
        ])
        guard case .ack = both else { throw TestFailure("the create and delete were refused: \(both)") }
        // The other connection's write comes after all of them: once it reaches the writer,
        // everything before it has been delivered.
        let marker = try await other.create("notes", ["t": "marker"])
        try await waitUntil("the other's write reaches the writer") {
            own.changes.contains { $0.document.id == marker.id }
        }
        #expect(
            own.summary == ["deleted \(created[0].id) v2", "deleted \(brief) v2", "added \(marker.id) v1"],
            "its deletes, none of its other writes")
        try await waitUntil("the other heard them all") { theirs.changes.contains { $0.document.id == marker.id } }
        #expect(theirs.summary.contains("added \(created[2].id) v1"), "the second page's row")
        #expect(theirs.summary.contains("deleted \(created[0].id) v2"))
        #expect(own.lastToken == theirs.lastToken)
    }

    @Test(
        "a listener's catch-up leaves out the writes its connection was answered with before the listen; its listener without the flag, and another connection's write, get everything"
    )
    func ownWritesBeforeListenLeftOut() async throws {
        let server = try await TestServer { $0.snapshotPageSize = 2 }
        let notes = try path("notes")
        let other = try await connect(server, as: "other")
        let seeded = try await other.write(
            (0..<10).map { n in .create(in: notes, fields: ["n": .int(Int64(n))], idempotencyKey: key()) })
        guard case .ack(let theirs) = seeded else { throw TestFailure("the seeding write was refused: \(seeded)") }
        let writer = try await connect(server, as: "writer")
        let reply = try await writer.write(
            (0..<5).map { n in .create(in: notes, fields: ["mine": .int(Int64(n))], idempotencyKey: key()) })
        guard case .ack(let mine) = reply else { throw TestFailure("the writer's creates were refused: \(reply)") }
        // Written again by the other connection: its later state reaches the writer.
        _ = try await other.update("notes", mine[0].id, ["mine": "theirs now"], base: 1)

        let own = Feed()
        let plain = Feed()
        writer.listen(to: notes, target: "own", excludingOwnWrites: true, handler: own.handler)
        writer.listen(to: notes, target: "plain", handler: plain.handler)
        try await waitUntil("both current") { own.isCurrent && plain.isCurrent }
        #expect(own.snapshots.allSatisfy { $0.initial })
        #expect(
            // (Its create is before the start of the page that brings it: it comes as modified.)
            Set(own.summary) == Set(theirs.map { "added \($0.id) v1" } + ["modified \(mine[0].id) v2"]),
            "the other's documents and the one it wrote again, none of the writer's own: \(own.summary)")
        #expect(plain.changes.count == 15, "the listener without the flag gets every document")
        #expect(own.lastToken == plain.lastToken)
    }

    @Test(
        "a listener's catch-up brings the tombstones of the deletes its connection was answered with before the listen")
    func ownDeletesInCatchUp() async throws {
        let server = try await TestServer()
        let writer = try await connect(server, as: "writer")
        _ = try await writer.create("notes", ["t": "kept"])
        let gone = try await writer.create("notes", ["t": "gone"])
        _ = try await writer.delete("notes", gone.id, base: 1)
        let own = Feed()
        writer.listen(to: try path("notes"), excludingOwnWrites: true, handler: own.handler)
        try await waitUntil("current") { own.isCurrent }
        // (The writer created the deleted document: it alone hears of that delete.)
        #expect(own.summary == ["deleted \(gone.id) v2"], "the tombstone, not the kept create: \(own.summary)")
    }

    @Test(
        "a listener still catching up leaves out the writes its connection was answered with meanwhile; another connection's write reaches it"
    )
    func ownWritesLeftOutWhileCatchingUp() async throws {
        for _ in 1...5 where try await Self.catchUpAttempt(afterReset: false) { return }
        Issue.record("in five attempts, the listener never caught up past the writes (they all came live)")
    }

    @Test(
        "the full snapshot after a reset carries the connection's own writes: a client drops the rows it does not bring"
    )
    func resetSnapshotCarriesOwnWrites() async throws {
        for _ in 1...5 where try await Self.catchUpAttempt(afterReset: true) { return }
        Issue.record("in five attempts, the listener never caught up past the writes (they all came live)")
    }

    /// One attempt: 400 documents, pages of 2 (200 pages, each sent once the one before has
    /// drained), a listener that leaves out its own writes, and five creates its connection
    /// sends right after the listen, then one by another connection. It counts only when the
    /// catch-up read past the five (its last page's token is at or after their sequences,
    /// 401–405): otherwise they came live, which the tests above cover, and it returns false.
    static func catchUpAttempt(afterReset: Bool) async throws -> Bool {
        let server = try await TestServer { $0.snapshotPageSize = 2 }
        let notes = try path("notes")
        let other = try await connect(server, as: "other")
        for _ in 0..<2 {
            let seeded = try await other.write(
                (0..<200).map { n in .create(in: notes, fields: ["n": .int(Int64(n))], idempotencyKey: key()) })
            guard case .ack = seeded else { throw TestFailure("the seeding write was refused: \(seeded)") }
        }

        let writer = try await connect(server, as: "writer")
        let own = Feed()
        // A token of another database: a reset, then the full snapshot.
        writer.listen(
            to: notes, resumeToken: afterReset ? "SomeOtherDB.1" : nil, excludingOwnWrites: true,
            handler: own.handler)
        let reply = try await writer.write(
            (0..<5).map { n in .create(in: notes, fields: ["mine": .int(Int64(n))], idempotencyKey: key()) })
        guard case .ack(let mine) = reply else { throw TestFailure("the writer's creates were refused: \(reply)") }
        let theirs = try await other.create("notes", ["t": "theirs"])
        try await waitUntil("the other's write reaches the listener") {
            own.isCurrent && own.changes.contains { $0.document.id == theirs.id }
        }
        let lastPage = try #require(own.snapshots.last { $0.initial })
        guard let reached = ResumeToken(lastPage.resumeToken)?.sequence, reached >= 405 else { return false }

        let received = Set(own.changes.map(\.document.id))
        #expect(received.isSuperset(of: [theirs.id]))
        #expect(received.count(where: { id in !mine.contains { $0.id == id } }) == 401, "the 400 seeded and theirs")
        if afterReset {
            #expect(own.resets.count == 1)
            #expect(received.isSuperset(of: mine.map(\.id)), "every own write, in the reset's full snapshot")
        } else {
            #expect(own.resets.isEmpty)
            #expect(received.isDisjoint(with: mine.map(\.id)), "none of its own writes: \(own.summary)")
        }
        return true
    }

    /// The writer's own write and a later one, by a connection that does not leave out its own
    /// writes, committed together: the page holds the later state, which the writer's ack did
    /// not tell it, so it reaches the writer.
    @Test("a later state of the writer's document, committed together with the writer's own write, reaches the writer")
    func laterWriteInTheSameCommit() async throws {
        for _ in 1...5 where try await Self.laterWriteAttempt() { return }
        Issue.record("in five attempts, the two updates never shared a commit in the order the test needs")
    }

    /// One attempt: the server's core is held on a third connection's commit while both updates
    /// arrive, so that they go into one group commit, the writer's first. The other's update is
    /// conditional on the writer's version; in the other order it is a conflict, and the
    /// attempt returns false, as it does when the two were committed apart.
    static func laterWriteAttempt() async throws -> Bool {
        let held = Checkpoint()
        let holding = Mutex(false)
        let server = try await TestServer { configuration in
            configuration.hooks.beforeCommit = { if holding.withLock({ $0 }) { held.pause() } }
        }
        defer { held.release() }
        let writer = try await connect(server, as: "writer")
        let own = Feed()
        writer.listen(to: try path("notes"), excludingOwnWrites: true, handler: own.handler)
        let other = try await connect(server, as: "other")
        let blocker = try await connect(server, as: "blocker")
        try await waitUntil("current") { own.isCurrent }
        let note = try await writer.create("notes", ["t": "first"])
        try await waitUntil("the create comes back as its token alone") { own.snapshots.count == 2 }

        holding.withLock { $0 = true }
        let hold = Task { try await blocker.create("elsewhere", ["t": "x"]) }
        try await held.reached()
        holding.withLock { $0 = false }
        let mine = Task { try await writer.update("notes", note.id, ["t": "mine"], base: 1) }
        try await Task.sleep(for: .milliseconds(200))  // so that the writer's update is read first
        let theirs = Task { try await other.update("notes", note.id, ["t": "theirs"], base: 2) }
        try await Task.sleep(for: .milliseconds(200))
        held.release()
        _ = try await hold.value
        guard case .ack = try await mine.value, case .ack(let results) = try await theirs.value else { return false }
        #expect(results.first?.version == 3)
        try await waitUntil("the other's state reaches the writer") {
            own.changes.contains { $0.document.id == note.id && $0.document.version == 3 }
        }
        // Committed apart (the other's update was read after the group was committed): not the
        // case this test is about, and the attempt starts again.
        guard own.snapshots.count == 3 else { return false }
        #expect(own.changes.last?.document.fields == ["t": "theirs"])
        #expect(!own.changes.contains { $0.document.version == 2 }, "its own update is left out")
        return true
    }
}
