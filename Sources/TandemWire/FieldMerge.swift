/// The field-level merge: a last-writer-wins map, field by field.
///
/// Each field keeps the value with the later time. On equal times, the value whose canonical
/// JSON sorts later wins, so that every replica picks the same one. The result depends only on
/// the set of writes, not on their order, and merging a write twice changes nothing: the merge
/// is commutative, associative and idempotent, so replicas that have seen the same writes hold
/// the same document, whatever order the writes arrived in.
///
/// For example:
///
/// ```swift
/// let merged = FieldMerge.merge(
///     stored: (["title": "Rent", "amount": -100], ["title": 5, "amount": 5]),
///     incoming: (["title": "Rent (May)"], ["title": 7]))
/// // merged.fields == ["title": "Rent (May)", "amount": -100]
/// ```
public enum FieldMerge {
    public static func merge(
        stored: (fields: JSONObject, times: [String: Int64]), incoming: (fields: JSONObject, times: [String: Int64])
    ) -> (fields: JSONObject, times: [String: Int64]) {
        var fields = stored.fields
        var times = stored.times
        for (name, value) in incoming.fields {
            let incomingTime = incoming.times[name] ?? 0
            let storedTime = stored.times[name] ?? 0
            guard let current = stored.fields[name] else {
                fields[name] = value
                times[name] = incomingTime
                continue
            }
            if incomingTime > storedTime || (incomingTime == storedTime && Self.sortsAfter(value, current)) {
                fields[name] = value
                times[name] = incomingTime
            }
        }
        return (fields, times)
    }

    /// Whether `value` wins a tie against `other`: a total order on JSON values.
    public static func sortsAfter(_ value: JSONValue, _ other: JSONValue) -> Bool {
        let left = Wire.encodeCanonical(value)
        let right = Wire.encodeCanonical(other)
        return left.lexicographicallyPrecedes(right) == false && left != right
    }
}
