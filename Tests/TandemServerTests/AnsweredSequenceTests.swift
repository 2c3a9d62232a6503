import TandemHarness
import Testing

@testable import TandemServer

/// What a session notes of its answered writes: run by run, as one by one.
@Suite("Answered sequences")
struct AnsweredSequenceTests {
    /// The sequences of a few writes: rising, mostly by one, with gaps and ops not noted (nil);
    /// with `stepsBack`, also going back and repeating.
    private static func writes(_ random: inout SeededGenerator, stepsBack: Bool) -> [[Int64?]] {
        var next = Int64.random(in: 1...5, using: &random)
        return (0..<Int.random(in: 1...6, using: &random)).map { _ in
            (0..<Int.random(in: 0...12, using: &random)).map { _ -> Int64? in
                switch Int.random(in: 0..<10, using: &random) {
                case 0: return nil
                case 1: next += Int64.random(in: 2...4, using: &random)
                case 2 where stepsBack: next -= Int64.random(in: 0...3, using: &random)
                default: next += 1
                }
                return next
            }
        }
    }

    @Test("rising sequences go in run by run as they would one by one, under the cap on runs too")
    func risingAsOneByOne() {
        var random = SeededGenerator(seed: 5)
        for _ in 0..<500 {
            let cap = Int.random(in: 1...6, using: &random)
            var (runs, count) = (RangeSet<Int64>(), 0)
            var (expected, expectedCount) = (RangeSet<Int64>(), 0)
            for sequences in Self.writes(&random, stepsBack: false) {
                Session.note(sequences[...], in: &runs, counting: &count, cap: cap)
                for case let sequence? in sequences {
                    if expected.ranges.last?.upperBound != sequence && expectedCount >= cap { continue }
                    let before = expected.ranges.count
                    expected.insert(contentsOf: sequence..<sequence + 1)
                    expectedCount += expected.ranges.count - before
                }
                #expect(runs == expected, "\(sequences)")
                #expect(count == expectedCount)
            }
        }
    }

    @Test("any sequences: only the writes' own are noted, all of them under the cap, and the runs counted")
    func anyOrder() {
        var random = SeededGenerator(seed: 6)
        for _ in 0..<500 {
            let cap = Int.random(in: 1...6, using: &random)
            var (runs, count) = (RangeSet<Int64>(), 0)
            var written = RangeSet<Int64>()
            for sequences in Self.writes(&random, stepsBack: true) {
                let before = (runs, count)
                Session.note(sequences[...], in: &runs, counting: &count, cap: cap)
                for case let sequence? in sequences { written.insert(contentsOf: sequence..<sequence + 1) }
                #expect(written.isSuperset(of: runs), "\(sequences)")
                #expect(count == runs.ranges.count)
                #expect(count <= max(cap, before.1))
                // Below the cap throughout (a sequence makes one run at most): all of them.
                if before.1 + sequences.count < cap {
                    #expect(runs == before.0.union(RangeSet(sequences.compactMap { $0 }.map { $0..<$0 + 1 })))
                }
            }
        }
    }
}
