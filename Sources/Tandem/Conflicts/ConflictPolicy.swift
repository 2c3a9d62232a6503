import TandemWire

/// How a conflict between a local change and the server's version of a row is settled.
///
/// A conflict arises in two places, which go through the same code: a push answered with
/// `conflict` (someone else wrote the document since this device last saw it), and a
/// listener change arriving for a row with unpushed local changes.
public enum ConflictPolicy: Sendable, Hashable {
    /// The whole row with the later `updatedAt` wins; on a tie the server's version wins
    /// (it is the one all devices already share). What loses: the other side's edits to
    /// that row, even to fields the winner did not touch.
    case lastWriteWins
}

/// Both sides of a conflict.
struct Conflict {
    /// When the local change was made (the row's `updatedAt`).
    var localUpdatedAt: Int64
    /// The server's document.
    var remote: Document

    /// When the server's version was made, as the writing device stamped it.
    var remoteUpdatedAt: Int64 { remote.fields["updatedAt"]?.intValue ?? remote.updateTime }
}

enum Resolution: Equatable {
    /// Keep the local row and push it over the server's version.
    case keepLocal
    /// Take the server's version; the local change is dropped.
    case takeRemote
}

extension ConflictPolicy {
    func resolve(_ conflict: Conflict) -> Resolution {
        switch self {
        case .lastWriteWins:
            conflict.localUpdatedAt > conflict.remoteUpdatedAt ? .keepLocal : .takeRemote
        }
    }
}
