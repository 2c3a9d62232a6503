#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A check for waits that block their thread, run before each one (a checkpoint's pause, a
/// push waiting for its acknowledgement, a test reading a raw socket, a wait for a child
/// process).
///
/// Swift concurrency runs every task on a few threads, one per core; a task that blocks one
/// of them takes a core's worth of progress from every other task of the process, and on a
/// 2-core CI runner two such waits stall everything. With `TANDEM_CHECK_BLOCKING=1` in the
/// environment, a blocking wait on one of those threads stops the process and names itself;
/// with `report`, it is listed on standard error and the run goes on. Without either the
/// check costs one load of a constant.
package enum BlockingCheck {
    private enum Mode { case off, stop, report }

    private static let mode: Mode =
        switch getenv("TANDEM_CHECK_BLOCKING").map({ String(cString: $0) }) {
        case "1": .stop
        case "report": .report
        default: .off
        }

    /// When `what` is about to block a thread of the cooperative pool: stops the process
    /// (`TANDEM_CHECK_BLOCKING=1`) or says so on standard error, naming the caller
    /// (`TANDEM_CHECK_BLOCKING=report`, to list every such wait in one run).
    package static func willBlock(
        _ what: @autoclosure () -> String, file: StaticString = #fileID, line: UInt = #line
    ) {
        guard mode != .off, onCooperativePool else { return }
        let message = "\(what()) at \(file):\(line) blocks a thread of Swift concurrency's cooperative pool"
        if mode == .stop {
            fatalError(message + " (TANDEM_CHECK_BLOCKING=1): run it on a thread of its own or wait asynchronously")
        }
        let line = Array("tandem: blocking wait: \(message)\n".utf8)
        _ = line.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
    }

    /// True on a thread the global concurrent executor runs tasks on: libdispatch labels its
    /// queue "Swift global concurrent queue" (read with `dispatch_queue_get_label(NULL)`, which
    /// the Dispatch module does not export on Linux).
    package static var onCooperativePool: Bool {
        guard let getLabel, let label = getLabel(nil) else { return false }
        return strcmp(label, "Swift global concurrent queue") == 0
    }

    private typealias GetLabel = @convention(c) (OpaquePointer?) -> UnsafePointer<CChar>?
    private static let getLabel: GetLabel? = dlsym(
        UnsafeMutableRawPointer(bitPattern: 0), "dispatch_queue_get_label"
    ).map { unsafeBitCast($0, to: GetLabel.self) }
}
