import Foundation
import Synchronization
import TandemWire

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A child process started with `posix_spawn`, with the part of `Foundation.Process` that the
/// tests and the scenario commands use (executable, arguments, environment, folder, standard
/// streams as pipes or file handles, waiting, signals).
///
/// Not `Foundation.Process`: on Linux, swift-corelibs-foundation's `Process.run()` (6.3.1 and
/// before) reads each `/proc/self/fd` entry by copying the whole 256-byte `d_name` field, past
/// the end of the record; when the record ends glibc's buffer and the next page is unmapped, the
/// whole test process dies with SIGSEGV in `memcpy` (swiftlang/swift-corelibs-foundation#5472).
/// It happened here a few times in a hundred test runs, taking every test of the run with it.
///
/// As `Foundation.Process` does, the child gets its own process group and inherits no file
/// descriptor but its standard streams; the parent closes its copies of the child's pipe ends,
/// so that reading a child's output ends when the child does.
public final class ChildProcess: @unchecked Sendable {
    public var executableURL: URL?
    public var arguments: [String] = []
    /// The child's environment; this process's when nil.
    public var environment: [String: String]?
    /// The child's working folder; this process's when nil.
    public var currentDirectoryURL: URL?
    /// A `Pipe` or a `FileHandle` for each stream; nil keeps this process's.
    public var standardInput: Any?
    public var standardOutput: Any?
    public var standardError: Any?

    private let condition = NSCondition()
    private var pid: pid_t = 0
    private var waitStatus: Int32?
    private var reaping = false

    public init() {}

    public var processIdentifier: Int32 { condition.withLock { pid } }

    /// Starts the child.
    ///
    /// - Throws: ``ChildProcessError`` naming the executable and why it could not start.
    public func run() throws {
        guard let executableURL else { throw ChildProcessError("no executable to run") }
        let path = executableURL.path
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        // Its own process group; no signal blocked or ignored, whatever the calling thread's
        // mask (dispatch and cooperative-pool threads block SIGTERM and SIGINT, and a child
        // inherits both the mask and ignored signals).
        posix_spawnattr_setflags(
            &attributes, Int16(POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        posix_spawnattr_setpgroup(&attributes, 0)
        var signals = sigset_t()
        sigemptyset(&signals)
        posix_spawnattr_setsigmask(&attributes, &signals)
        sigfillset(&signals)
        posix_spawnattr_setsigdefault(&attributes, &signals)

        let streams: [(Any?, Int32, input: Bool)] = [
            (standardInput, 0, true), (standardOutput, 1, false), (standardError, 2, false),
        ]
        for (stream, target, input) in streams {
            let status: Int32
            switch Self.descriptor(of: stream, input: input) {
            case nil: continue
            // `FileHandle.nullDevice` has no descriptor of its own (-1): open /dev/null in the child.
            case let fd? where fd < 0:
                status = posix_spawn_file_actions_addopen(&actions, target, "/dev/null", input ? O_RDONLY : O_WRONLY, 0)
            case let fd?: status = posix_spawn_file_actions_adddup2(&actions, fd, target)
            }
            guard status == 0 else {
                throw ChildProcessError("cannot set up stream \(target) of \(path): \(Self.describe(status))")
            }
        }
        try Self.closeFrom(3, &actions)
        if let folder = currentDirectoryURL {
            guard let addchdir = Self.addchdir else {
                throw ChildProcessError("this C library cannot start a process in another folder (\(folder.path))")
            }
            let status = folder.path.withCString { addchdir(&actions, $0) }
            guard status == 0 else {
                throw ChildProcessError("cannot use folder \(folder.path): \(Self.describe(status))")
            }
        }

        let environment = (environment ?? ProcessInfo.processInfo.environment).map { "\($0.key)=\($0.value)" }
        var argv: [UnsafeMutablePointer<CChar>?] = ([path] + arguments).map { strdup($0) } + [nil]
        var envp: [UnsafeMutablePointer<CChar>?] = environment.map { strdup($0) } + [nil]
        defer {
            argv.forEach { free($0) }
            envp.forEach { free($0) }
        }
        var child: pid_t = 0
        let status = posix_spawn(&child, path, &actions, &attributes, &argv, &envp)
        guard status == 0 else {
            throw ChildProcessError("cannot start \(path): \(Self.describe(status))")
        }
        condition.withLock { pid = child }
        // The child has its own copies; ours would keep its output open after it exits.
        for (stream, _, input) in streams {
            guard let pipe = stream as? Pipe else { continue }
            try? (input ? pipe.fileHandleForReading : pipe.fileHandleForWriting).close()
        }
    }

    /// Blocks until the child has exited (any number of threads may wait).
    public func waitUntilExit(file: StaticString = #fileID, line: UInt = #line) {
        if isRunning { BlockingCheck.willBlock("ChildProcess.waitUntilExit()", file: file, line: line) }
        condition.lock()
        defer { condition.unlock() }
        while waitStatus == nil {
            guard pid > 0 else { return }
            if reaping {
                condition.wait()
                continue
            }
            reaping = true
            let child = pid
            condition.unlock()
            var status: Int32 = 0
            while waitpid(child, &status, 0) == -1 && errno == EINTR {}
            condition.lock()
            waitStatus = status
            reaping = false
            condition.broadcast()
        }
    }

    /// Waits until the child has exited, on a thread of its own: for tasks.
    public func exited() async {
        _ = try? await onOwnThread { self.waitUntilExit() }
    }

    /// Sends `signal` and returns; a thread of its own reaps the child, with SIGKILL if it has
    /// not exited `grace` later. For clean-up that cannot wait (`defer`, `deinit`).
    public func end(with signal: Int32, grace: Duration = .seconds(10)) {
        self.signal(signal)
        Thread.detachNewThread {
            let deadline = ContinuousClock.now + grace
            while self.isRunning && ContinuousClock.now < deadline { Thread.sleep(forTimeInterval: 0.05) }
            self.signal(SIGKILL)
            self.waitUntilExit()
        }
    }

    /// True until the child has exited.
    public var isRunning: Bool {
        condition.withLock {
            guard pid > 0, waitStatus == nil else { return false }
            if reaping { return true }
            var status: Int32 = 0
            guard waitpid(pid, &status, WNOHANG) == pid else { return true }
            waitStatus = status
            condition.broadcast()
            return false
        }
    }

    /// The exit code, or the number of the signal that ended the child; -1 while it runs.
    public var terminationStatus: Int32 {
        condition.withLock {
            guard let status = waitStatus else { return -1 }
            let signal = status & 0x7f
            return signal == 0 ? (status >> 8) & 0xff : signal
        }
    }

    /// True when a signal ended the child.
    public var endedBySignal: Bool {
        condition.withLock { waitStatus.map { $0 & 0x7f != 0 } ?? false }
    }

    /// Sends SIGTERM.
    public func terminate() { signal(SIGTERM) }

    /// Sends SIGINT.
    public func interrupt() { signal(SIGINT) }

    /// Sends `signal` while the child runs.
    public func signal(_ signal: Int32) {
        // Under the lock, so that no thread of ours reaps the child (freeing its pid for
        // reuse) between the check and the kill.
        condition.withLock {
            guard pid > 0, waitStatus == nil else { return }
            var status: Int32 = 0
            if !reaping && waitpid(pid, &status, WNOHANG) == pid {
                waitStatus = status
                condition.broadcast()
                return
            }
            kill(pid, signal)
        }
    }

    // MARK: - Plumbing

    private static func descriptor(of stream: Any?, input: Bool) -> Int32? {
        switch stream {
        case let pipe as Pipe: (input ? pipe.fileHandleForReading : pipe.fileHandleForWriting).fileDescriptor
        case let handle as FileHandle: handle.fileDescriptor
        default: nil
        }
    }

    private typealias AddCloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
    private typealias AddChdir =
        @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, UnsafePointer<CChar>) -> Int32

    /// glibc 2.34's `posix_spawn_file_actions_addclosefrom_np` and 2.29's
    /// `posix_spawn_file_actions_addchdir_np`, which the Glibc module does not declare.
    private static let addCloseFrom: AddCloseFrom? = symbol("posix_spawn_file_actions_addclosefrom_np")
    private static let addchdir: AddChdir? = symbol("posix_spawn_file_actions_addchdir_np")

    private static func symbol<T>(_ name: String) -> T? {
        guard let address = dlsym(UnsafeMutableRawPointer(bitPattern: 0), name) else { return nil }
        return unsafeBitCast(address, to: T.self)
    }

    /// Closes every descriptor from `first` on in the child: with `addclosefrom_np` where the C
    /// library has it, else each descriptor open now (read from `/proc/self/fd` without copying
    /// more of an entry's name than it has).
    private static func closeFrom(_ first: Int32, _ actions: inout posix_spawn_file_actions_t) throws {
        if let addCloseFrom {
            let status = addCloseFrom(&actions, first)
            guard status == 0 else { throw ChildProcessError("cannot close descriptors: \(describe(status))") }
            return
        }
        guard let folder = opendir("/proc/self/fd") else { return }
        defer { closedir(folder) }
        let own = dirfd(folder)
        let nameOffset = MemoryLayout<dirent>.offset(of: \dirent.d_name) ?? 19
        while let entry = readdir(folder) {
            let name = String(
                cString: UnsafeRawPointer(entry).advanced(by: nameOffset).assumingMemoryBound(to: CChar.self))
            if let fd = Int32(name), fd >= first, fd != own { posix_spawn_file_actions_addclose(&actions, fd) }
        }
    }

    private static func describe(_ status: Int32) -> String { String(cString: strerror(status)) }
}

public struct ChildProcessError: Error, CustomStringConvertible {
    public var description: String
    init(_ description: String) { self.description = description }
}
