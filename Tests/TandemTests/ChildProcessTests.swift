import Foundation
import TandemTesting
import Testing

/// `ChildProcess` starts the servers, devices and PostgreSQL clusters of the tests: a child that
/// kept one of this process's streams open would keep `swift test` waiting after the tests end.
@Suite("Child processes")
struct ChildProcessTests {
    @Test("a child's streams are what it was given (/dev/null, a pipe); nothing else is inherited; SIGTERM ends it")
    func streams() async throws {
        let process = ChildProcess()
        process.executableURL = URL(fileURLWithPath: "/bin/sleep")
        process.arguments = ["60"]
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = FileHandle.nullDevice
        let errors = Pipe()
        process.standardError = errors
        try process.run()
        let folder = "/proc/\(process.processIdentifier)/fd"
        var descriptors: [Int: String] = [:]
        for name in try FileManager.default.contentsOfDirectory(atPath: folder) {
            descriptors[Int(name)!] = try? FileManager.default.destinationOfSymbolicLink(atPath: "\(folder)/\(name)")
        }
        #expect(descriptors[0] == "/dev/null")
        #expect(descriptors[1] == "/dev/null")
        #expect(descriptors[2]?.hasPrefix("pipe:") == true)
        // `sleep` opens files of its own while it starts (the locale); none of this process's
        // sockets, pipes or event descriptors may be there.
        let inherited = descriptors.filter { descriptor, target in
            descriptor > 2 && ["socket:", "pipe:", "anon_inode:"].contains { target.hasPrefix($0) }
        }
        #expect(inherited.isEmpty, "\(inherited)")

        // Whatever the spawning thread blocks, the child does not: SIGTERM ends it (not the 60 s).
        process.terminate()
        await process.exited()
        #expect(process.endedBySignal && process.terminationStatus == SIGTERM)
    }

    @Test("reading a child's output ends when the child exits, and its status is kept")
    func outputEnds() async throws {
        let process = ChildProcess()
        process.executableURL = URL(fileURLWithPath: "/bin/sh")
        process.arguments = ["-c", "echo hello; exit 3"]
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        let text = try await onOwnThread {
            String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        }
        await process.exited()
        #expect(text == "hello\n")
        #expect(process.terminationStatus == 3)
        #expect(!process.isRunning)
    }

    @Test("a program that does not exist is a clear error")
    func missingProgram() {
        let process = ChildProcess()
        process.executableURL = URL(fileURLWithPath: "/nonexistent/tandem")
        #expect {
            try process.run()
        } throws: { error in
            "\(error)".contains("/nonexistent/tandem")
        }
    }
}
