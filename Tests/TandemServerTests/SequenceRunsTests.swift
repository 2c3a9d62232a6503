import Testing

@testable import TandemServer

/// The runs of feed sequences a connection's answered writes are noted in (pure logic; the
/// catch-up tests in FeedTests check what they leave out on the wire).
@Suite("Runs of feed sequences")
struct SequenceRunsTests {
    @Test("consecutive sequences make one run; a gap starts another; each is found, and nothing between")
    func runs() {
        var runs = SequenceRuns()
        var started = (Int64(1)...500).map { runs.append($0, mayStartRun: true) }
        started += [503, 504].map { runs.append($0, mayStartRun: true) }
        #expect(started == [true] + Array(repeating: false, count: 499) + [true, false])
        #expect(runs.runs == [1...500, 503...504])
        #expect(runs.contains(1) && runs.contains(250) && runs.contains(500) && runs.contains(504))
        #expect(!runs.contains(0) && !runs.contains(501) && !runs.contains(502) && !runs.contains(505))
    }

    @Test("a sequence not after the others is left out, and no run starts past the cap")
    func outOfOrderAndCap() {
        var runs = SequenceRuns()
        let started = [
            runs.append(10, mayStartRun: true),
            runs.append(7, mayStartRun: true),
            runs.append(10, mayStartRun: true),
            runs.append(20, mayStartRun: false),  // no new run past the cap
            runs.append(11, mayStartRun: false),  // the last run still grows
        ]
        #expect(started == [true, false, false, false, false])
        #expect(runs.runs == [10...11])
    }
}
