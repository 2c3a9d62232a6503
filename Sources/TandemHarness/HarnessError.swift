/// Something the harness started or reached for did not do what it must (a process that did
/// not say it listens, a port that cannot be bound, a tool that failed), saying what.
public struct HarnessError: Error, CustomStringConvertible {
    public var description: String
    package init(_ description: String) { self.description = description }
}
