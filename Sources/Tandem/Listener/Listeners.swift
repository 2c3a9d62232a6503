import TandemWire

/// The listeners open on the current connection, and the names they were opened under.
///
/// A name (the protocol's `target`) is never used twice on a connection: a collection listened
/// to again after its listener closed gets a new one (`path#1`, `path#2`, …), so that what the
/// server still sends for the closed one finds no handler, instead of reaching the new one
/// before the first snapshot it asked for. (What the closed one delivered before it closed is
/// still applied, for the row it was opened for: nothing of it is kept once that row is gone.)
/// A name is at most ``Wire/maxLabelBytes``: a longer path (nested collections with long names)
/// is named by the listener's number on the connection and the end of the path
/// (`#7:…/entries`). Paths never hold `#`, so no two names are alike.
struct Listeners {
    struct Open {
        var target: ListenerTarget
        var name: String
    }

    /// A listener's name, and whether it is the first listener of its collection on this
    /// connection.
    struct Name {
        var text: String
        var isFirst: Bool
    }

    var open: [CollectionPath: Open] = [:]
    /// How many listeners each collection had on this connection.
    private var opened: [CollectionPath: Int] = [:]
    /// How many listeners opened on this connection.
    private var count = 0

    /// Records a listener about to open, and returns its name.
    mutating func opening(_ path: CollectionPath, _ target: ListenerTarget) -> Name {
        let times = opened[path, default: 0]
        opened[path] = times + 1
        count += 1
        var name = times == 0 ? path.rawValue : "\(path.rawValue)#\(times)"
        if name.utf8.count > Wire.maxLabelBytes {
            let prefix = "#\(count):"
            // A path is ASCII, so any suffix of its bytes is a string.
            name = prefix + String(path.rawValue.utf8.suffix(Wire.maxLabelBytes - prefix.utf8.count))!
        }
        open[path] = Open(target: target, name: name)
        return Name(text: name, isFirst: times == 0)
    }
}
