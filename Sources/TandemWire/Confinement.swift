import Dispatch

/// Checks, in debug builds, what a comment claims about who owns some state: that the code
/// runs on the queue that owns it. GRDB does the same with `preconditionValidQueue`, SwiftNIO
/// with `preconditionInEventLoop`; a wrong hop then stops the test that makes it, where it is
/// made, instead of racing quietly. Release builds check nothing (`dispatchPrecondition` alone
/// would, being a `precondition`).
package enum Confinement {
    /// Stops a debug build unless the caller runs on `queue`. (`dispatchPrecondition` names no
    /// caller: the crash's backtrace does.)
    @inline(__always)
    package static func check(_ queue: DispatchQueue) {
        #if DEBUG
            dispatchPrecondition(condition: .onQueue(queue))
        #endif
    }

    /// Stops a debug build unless `condition` holds (a thread's identity, say).
    @inline(__always)
    package static func check(
        _ condition: @autoclosure () -> Bool, _ message: @autoclosure () -> String, file: StaticString = #fileID,
        line: UInt = #line
    ) {
        #if DEBUG
            precondition(condition(), message(), file: file, line: line)
        #endif
    }
}
