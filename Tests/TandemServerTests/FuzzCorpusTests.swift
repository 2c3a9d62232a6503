import Foundation
import TandemFuzzing
import TandemTesting
import Testing

@Suite("The fuzz corpus, replayed")
struct FuzzCorpusTests {
    static let corpus = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fuzz/corpus")

    @Test("every input of Fuzz/corpus is answered: no crash, no hang, nothing but protocol messages")
    func replay() async throws {
        let files = try CorpusFiles.list([Self.corpus])
        #expect(files.count >= 50, "the seeds are missing from \(Self.corpus.path)")
        // The harness blocks its thread on socket reads: not on the concurrency pool.
        let findings = try await onOwnThread {
            let harness = try FuzzHarness()
            defer { harness.shutdown() }
            var findings: [String] = []
            for file in files {
                do {
                    try harness.run(Array(try Data(contentsOf: file)))
                } catch {
                    findings.append("\(file.lastPathComponent): \(error)")
                }
            }
            return findings
        }
        #expect(findings.isEmpty, "\(findings.prefix(5))")
    }

    @Test("a fragment of invalid UTF-8 closes that connection with 1007; the next input gets a new one")
    func invalidUTF8() async throws {
        let closeCodes = try await onOwnThread {
            let harness = try FuzzHarness()
            defer { harness.shutdown() }
            // frames surface, open server: a text fragment ending in a cut-off three-byte
            // sequence, then a continuation that does not finish it.
            try harness.run([1, 0, 0x01, 6] + Array(#"{"a":"#.utf8) + [0xE2, 0x80, 2, 0x41, 0x41])
            try harness.run([0, 0] + Array(#"{"type":"get","request":"r","collection":"c","id":"i"}"#.utf8))
            return harness.closeCodes
        }
        #expect(closeCodes == [1007: 1])
    }
}
