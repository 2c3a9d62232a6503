import Foundation
import Observation
import Synchronization
@_spi(Testing) import Tandem
import TandemServer
import TandemTesting
import TandemWire
import Testing

/// What an app on a phone needs besides syncing: a status a SwiftUI view can observe, and a
/// sync that ends by a deadline (background work), cut off mid-push without harm.
@Suite("App life: observable status, bounded sync")
struct AppLifeTests {
    /// Opens and closes, for a server hook that must wait.
    final class Gate: Sendable {
        private let open = Mutex(false)
        private let held = Mutex(0)
        func hold() {
            held.withLock { $0 += 1 }
            while !open.withLock({ $0 }) { usleep(1000) }
        }
        func release() { open.withLock { $0 = true } }
        var holds: Int { held.withLock { $0 } }
    }

    @Test(
        "a bounded sync cut off at its deadline mid-push returns in time; the next one sends the same keys and nothing is doubled"
    )
    func boundedSyncCutOff() async throws {
        let gate = Gate()
        let server = try await TestServer { configuration in
            configuration.hooks.beforeCommit = { gate.hold() }
        }
        let sent = Seen<[String]>()
        let phone = try TestDevice(name: "phone", serverURL: server.url) { configuration in
            configuration.hooks.beforeSend = { ops in sent.append(ops.map(\.idempotencyKey.rawValue)) }
        }
        phone.service.start()
        try await waitUntil("the phone is connected") { phone.service.status.isConnected }
        _ = try await phone.addAccount("Household")
        // The push it starts reaches the server, which holds its commit: no push can end before
        // the deadline.
        try await waitUntil("the push reached the server's commit") { gate.holds >= 1 }

        let started = ContinuousClock.now
        let first = await phone.service.sync(within: .seconds(2))
        let took = ContinuousClock.now - started
        #expect(!first.finished)
        #expect(first.error?.code == .timedOut, "\(String(describing: first.error))")
        #expect(first.pending >= 1)
        // A bound on progress, not speed: it returns at its deadline, not once the push ends.
        #expect(took < .seconds(30), "returned after \(took)")

        // The server commits what it held (its answer goes to a connection that is gone).
        gate.release()
        let second = await phone.service.sync(within: .seconds(60))
        #expect(second.finished, "\(second)")
        #expect(second.pending == 0)
        #expect(try await phone.serverId(ofAccount: try #require(phone.accounts().first?.id)) != nil)
        let accounts = try #require(try await server.server.collections().first { $0.rawValue == "accounts" })
        #expect(try await server.server.documents(in: accounts).count == 1)
        // Every push of the account carried its first key.
        #expect(Set(sent.all.flatMap { $0 }).count == 1, "\(sent.all)")
    }

    @Test("a bounded sync with nothing in the way pushes, applies what arrives, and says it finished")
    func boundedSyncFinishes() async throws {
        let server = try await TestServer()
        let phone = try TestDevice(name: "phone", serverURL: server.url)
        let laptop = try TestDevice(name: "laptop", serverURL: server.url)
        for device in [phone, laptop] { device.service.start() }
        let account = try await phone.addAccount("Household")
        try await phone.addEntry("Rent", amount: -1200, account: account.id!)
        let run = await phone.service.sync(within: .seconds(60))
        #expect(run.finished && run.pending == 0 && run.error == nil, "\(run)")
        try await waitUntil("the laptop has the entry") { try await laptop.entries().count == 1 }
    }

    @MainActor
    @Test("the observable status tells an observer when the service connects")
    func observableStatus() async throws {
        let server = try await TestServer()
        let phone = try TestDevice(name: "phone", serverURL: server.url)
        let status = phone.service.observableStatus()
        #expect(!status.isConnected)
        let changed = Seen<Bool>()
        withObservationTracking {
            _ = status.isConnected
        } onChange: {
            changed.append(true)
        }
        phone.service.start()
        try await waitUntil("the observer heard of the connection") { @Sendable in changed.count > 0 }
        try await waitUntil("the model shows it") { @Sendable in await MainActor.run { status.isConnected } }
    }
}
