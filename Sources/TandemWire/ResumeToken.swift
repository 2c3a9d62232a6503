/// A position in one collection's change feed: where a listener resumes.
///
/// Clients treat tokens as opaque strings. The server writes them as `EPOCH.SEQUENCE`: the
/// epoch names the database (a fresh data folder gets a new one, so a token from another
/// database is never mistaken for a position in this one) and the sequence is the number of
/// the collection's last write the listener has seen.
public struct ResumeToken: Hashable, Sendable, CustomStringConvertible {
    public var epoch: String
    public var sequence: Int64

    public init(epoch: String, sequence: Int64) {
        self.epoch = epoch
        self.sequence = sequence
    }

    /// Parses a token; nil when `string` is not of the form `EPOCH.SEQUENCE`.
    public init?(_ string: String) {
        guard let dot = string.lastIndex(of: "."), let sequence = Int64(string[string.index(after: dot)...]),
            sequence >= 0
        else { return nil }
        let epoch = string[..<dot]
        guard !epoch.isEmpty, epoch.utf8.count <= 64, epoch.utf8.allSatisfy(Name.isAllowed) else { return nil }
        self.epoch = String(epoch)
        self.sequence = sequence
    }

    public var description: String { "\(epoch).\(sequence)" }
}
