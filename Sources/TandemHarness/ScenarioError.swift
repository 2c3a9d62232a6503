/// A scenario that cannot go on, saying why (a server that did not start, a document that
/// did not arrive).
public struct ScenarioError: Error, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}
