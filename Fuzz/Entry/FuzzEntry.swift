import Foundation
import TandemFuzzing

#if TANDEM_LIBFUZZER
    // Built by scripts/fuzz with -sanitize=fuzzer. SwiftPM links an executable's entry point
    // as `main`, so libFuzzer's own main stays out and this one starts its driver.

    @_extern(c, "LLVMFuzzerRunDriver")
    func runFuzzerDriver(
        _ argc: UnsafeMutablePointer<CInt>,
        _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
        _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt
    ) -> CInt

    nonisolated(unsafe) private var harness: FuzzHarness?

    @main
    enum Fuzz {
        static func main() {
            var argc = CommandLine.argc
            var argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = CommandLine.unsafeArgv
            exit(
                runFuzzerDriver(&argc, &argv) { data, size in
                    do {
                        if harness == nil { harness = try FuzzHarness() }
                        let input = data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? []
                        try harness!.run(input)
                    } catch {
                        FileHandle.standardError.write(Data("tandem-fuzz finding: \(error)\n".utf8))
                        abort()
                    }
                    return 0
                })
        }
    }
#else
    /// Without libFuzzer: replays the files (or the files of the folders) given, one by one.
    @main
    enum ReplayCorpus {
        static func main() throws {
            let paths = CommandLine.arguments.dropFirst()
            guard !paths.isEmpty else {
                FileHandle.standardError.write(
                    Data("usage: tandem-fuzz FILE|FOLDER… (scripts/fuzz builds the libFuzzer version)\n".utf8))
                exit(2)
            }
            let files = try CorpusFiles.list(paths.map { URL(fileURLWithPath: $0) })
            let harness = try FuzzHarness()
            defer { harness.shutdown() }
            var findings = 0
            for (index, file) in files.enumerated() {
                do {
                    try harness.run(Array(try Data(contentsOf: file)))
                } catch {
                    findings += 1
                    print("\(file.path): \(error)")
                }
                if (index + 1) % 500 == 0 { print("replayed \(index + 1) of \(files.count)") }
            }
            let closes = harness.closeCodes.sorted { $0.key < $1.key }.map { "\($0.key): \($0.value)" }
            print(
                "replayed \(files.count) inputs, \(findings) findings; connections the server closed, by code: [\(closes.joined(separator: ", "))]"
            )
            if findings > 0 { exit(1) }
        }
    }
#endif
