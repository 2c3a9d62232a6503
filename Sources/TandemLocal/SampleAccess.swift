import TandemHarness
import TandemServer

/// Access files for tests, for an app of shared accounts (the README's example, with
/// transactions under `accounts/{account}/transactions`): alice, bob and carol have tokens; whoever creates an account owns it, and only the owner changes or deletes it; the
/// owner and the members listed in an account read and write its transactions; each user
/// reads and writes only their own notes.
public enum SampleAccess {
    public static let tokens = #"{"tokens": {"t-alice": "alice", "t-bob": "bob", "t-carol": "carol"}}"#
    public static let rules = #"""
        {"rules": [
          {"match": "accounts", "create": "request.owner == user",
           "update": "resource.owner == user && request.owner == user", "delete": "resource.owner == user"},
          {"match": "accounts/{account}/transactions",
           "read": "user == doc(accounts/{account}).owner || user in doc(accounts/{account}).members",
           "write": "user == doc(accounts/{account}).owner || user in doc(accounts/{account}).members"},
          {"match": "users/{uid}/notes", "read": "user == {uid}", "write": "user == {uid}"}
        ]}
        """#

    /// The parsed access control.
    public static func control() throws -> AccessControl {
        try AccessControl(tokens: (tokens, "tokens.json"), rules: (rules, "rules.json"))
    }
}
