import Testing

@testable import TandemWire

@Suite("Field-level merge")
struct FieldMergeTests {
    @Test("each field keeps its later write")
    func laterWins() {
        let merged = FieldMerge.merge(
            stored: (["title": "Rent", "amount": -100], ["title": 5, "amount": 9]),
            incoming: (["title": "Rent (May)", "amount": -50], ["title": 7, "amount": 3]))
        #expect(merged.fields == ["title": "Rent (May)", "amount": -100])
        #expect(merged.times == ["title": 7, "amount": 9])
    }

    @Test("the merge is commutative, associative and idempotent (500 random triples)")
    func algebra() {
        var random = SplitMix(seed: 7)
        let names = ["a", "b", "c", "d"]
        func write() -> (fields: JSONObject, times: [String: Int64]) {
            var fields: JSONObject = [:]
            var times: [String: Int64] = [:]
            for name in names where random.next() % 3 != 0 {
                fields[name] = .int(Int64(random.next() % 5))
                times[name] = Int64(random.next() % 4)  // small, so ties happen
            }
            return (fields, times)
        }
        for _ in 0..<500 {
            let (x, y, z) = (write(), write(), write())
            let xy = FieldMerge.merge(stored: x, incoming: y)
            let yx = FieldMerge.merge(stored: y, incoming: x)
            #expect(xy.fields == yx.fields && xy.times == yx.times, "commutative")
            let left = FieldMerge.merge(stored: xy, incoming: z)
            let right = FieldMerge.merge(stored: x, incoming: FieldMerge.merge(stored: y, incoming: z))
            #expect(left.fields == right.fields && left.times == right.times, "associative")
            let again = FieldMerge.merge(stored: xy, incoming: y)
            #expect(again.fields == xy.fields && again.times == xy.times, "idempotent")
        }
    }
}

struct SplitMix: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
