import Foundation
import Synchronization

extension Process {
    /// Starts the process, one launch at a time in this process.
    ///
    /// swift-corelibs-foundation's `Process.run()` is not safe to call from several threads at
    /// once: two launches at the same moment crashed the test process in `memcpy` inside
    /// `run()` (tests start servers, psql and openssl concurrently). The launch itself is
    /// short; what the process does after runs in parallel as before.
    public func runSerialized() throws {
        try processLaunches.withLock { _ in try run() }
    }
}

private let processLaunches = Mutex(())
