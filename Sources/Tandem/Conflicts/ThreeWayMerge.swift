import TandemWire

/// The three-way merge of a local row and a server version against their common base.
///
/// A field changed on one side only takes that side, without consulting clocks. A field
/// changed on both sides to different values is in conflict; with times, the later write
/// wins (ties broken as ``FieldMerge`` breaks them, so every device decides alike). Without a
/// base every differing field counts as changed on both sides.
///
/// `updatedAt` is not merged like a field: the result keeps the later of the two.
struct ThreeWayMerge: Equatable {
    var fields: JSONObject
    var times: [String: Int64]
    /// Fields changed on both sides to different values.
    var inConflict: Set<String>
    var changedLocally: Set<String>
    var changedRemotely: Set<String>

    static func merge(
        base: JSONObject?, local: (fields: JSONObject, times: [String: Int64]),
        remote: (fields: JSONObject, times: [String: Int64])
    ) -> ThreeWayMerge {
        var result = ThreeWayMerge(fields: [:], times: [:], inConflict: [], changedLocally: [], changedRemotely: [])
        let names = Set(local.fields.keys).union(remote.fields.keys).subtracting(["updatedAt"])
        for name in names {
            let mine = local.fields[name]
            let theirs = remote.fields[name]
            let original = base?[name]
            let localChanged = base == nil || mine != original
            let remoteChanged = base == nil || theirs != original
            if localChanged && mine != theirs { result.changedLocally.insert(name) }
            if remoteChanged && mine != theirs { result.changedRemotely.insert(name) }
            let localTime = local.times[name] ?? 0
            let remoteTime = remote.times[name] ?? 0
            let takeLocal: Bool
            if mine == theirs {
                takeLocal = localTime >= remoteTime
            } else if !remoteChanged {
                takeLocal = true
            } else if !localChanged {
                takeLocal = false
            } else {
                result.inConflict.insert(name)
                let value = mine ?? .null
                let other = theirs ?? .null
                takeLocal = localTime > remoteTime || (localTime == remoteTime && FieldMerge.sortsAfter(value, other))
            }
            let value = takeLocal ? mine : theirs
            if let value { result.fields[name] = value }
            result.times[name] = takeLocal ? localTime : remoteTime
        }
        let updatedAt = max(local.fields["updatedAt"]?.intValue ?? 0, remote.fields["updatedAt"]?.intValue ?? 0)
        result.fields["updatedAt"] = .int(updatedAt)
        result.times["updatedAt"] = updatedAt
        return result
    }
}
