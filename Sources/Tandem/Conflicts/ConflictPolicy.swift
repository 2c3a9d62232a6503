import TandemWire

/// How a conflict between unpushed local changes and a newer server version of a row is
/// settled. Chosen per table (``SyncTable/resolvingConflicts(with:)``), with a default in
/// ``SyncConfiguration/conflictPolicy``.
///
/// A conflict arises in two places, which go through the same code: a push answered with
/// `conflict` (another device wrote the document since this one last saw it), and a listener
/// change arriving for a row with unpushed local changes. Times are hybrid logical clock
/// values (see ``HybridLogicalClock``), so a device whose wall clock runs fast does not win
/// against a later edit made after it.
///
/// | policy | what wins | what can be lost | choose it when |
/// |---|---|---|---|
/// | ``lastWriteWins`` | the whole row with the later `updatedAt` (ties: the server's) | the other side's edits to that row, even to other fields | rows are edited as a whole, or rarely by two devices at once |
/// | ``fieldLevel`` | each field separately: a field changed on one side only takes that side; a field changed on both takes the later write | only the earlier of two edits to the same field | different people edit different fields of the same rows |
/// | ``manual`` | nothing automatically when both sides changed the same field: the row waits for the app | nothing | a person must decide (money, legal text) |
/// | ``custom(_:)`` | whatever the closure decides | what the closure drops | the app has its own rule |
///
/// Deletes, under every policy: a delete wins over a concurrent edit (the row is removed
/// everywhere), and a deleted document is never brought back by an older update.
public enum ConflictPolicy: Sendable {
    case lastWriteWins
    case fieldLevel
    case manual
    /// The closure may be called more than once for the same conflict: when another change of
    /// the same batch fails, the batch is rolled back and applied again. Decide from the
    /// context alone, without side effects.
    case custom(@Sendable (ConflictContext) -> ConflictResolution)
}

/// Both sides of a conflict, for a ``ConflictPolicy/custom(_:)`` resolver.
public struct ConflictContext: Sendable {
    public var table: String
    public var rowId: Int64
    /// The local row as a document would carry it (references as server ids).
    public var local: JSONObject
    /// The server's version.
    public var remote: Document
    /// The last server version this device saw, when it has one: the base of a three-way merge.
    public var base: JSONObject?
    /// Fields whose local value differs from the base (all of them without a base).
    public var changedLocally: Set<String>
    /// Fields whose server value differs from the base (all of them without a base).
    public var changedRemotely: Set<String>
    /// Fields changed on both sides, to different values.
    public var inConflict: Set<String>
    /// When the local row was last written (hybrid logical clock).
    public var localUpdatedAt: Int64
    /// When the server's version was written, as its writer stamped it.
    public var remoteUpdatedAt: Int64
}

/// What a ``ConflictPolicy/custom(_:)`` resolver, or the app resolving a ``ConflictRecord``,
/// decides.
public enum ConflictResolution: Sendable, Equatable {
    /// Keep the local row and push it over the server's version.
    case keepLocal
    /// Take the server's version; the local changes are dropped.
    case useServer
    /// Make the row these fields (a subset is fine: others keep their local value) and push it.
    case merge(fields: JSONObject)
}

/// Why a ``ConflictRecord`` is open.
public enum ConflictReason: String, Sendable, Equatable {
    /// Both sides changed the same fields, on a table with the ``ConflictPolicy/manual`` policy.
    case changed
    /// The row's document left its table's scope (``SyncTable/where(_:arrayContains:)``: it no
    /// longer matches, or its user may no longer read it) while the row, or a row under it, had
    /// unpushed changes. Under every policy: no policy can settle it, since the server's side
    /// may be withheld (``ConflictRecord/server`` is then the document's id, version 0 and no
    /// fields). Resolve it with ``ConflictResolution/useServer`` to let the row go, with the
    /// rows under it and their unpushed changes; with ``ConflictResolution/keepLocal`` (or
    /// ``ConflictResolution/merge(fields:)``) to push the changes first; the server's answer
    /// decides (a refusal leaves the rows failed), and the rows go once nothing under them
    /// waits to be pushed. When the document comes back into the scope first, the conflict
    /// closes by itself.
    case leftScope = "left-scope"
}

/// An open conflict: of a table with the ``ConflictPolicy/manual`` policy, or of a row that left
/// its table's scope with unpushed changes (``ConflictReason/leftScope``). The row does not sync
/// until the app resolves it with ``SyncService/resolve(_:with:)``.
public struct ConflictRecord: Sendable, Equatable, Identifiable {
    public var table: String
    public var rowId: Int64
    public var serverId: String
    /// The row when the conflict was found.
    public var local: JSONObject
    /// The server's latest version.
    public var server: Document
    /// The last version both sides agreed on.
    public var base: JSONObject?
    /// The fields changed on both sides.
    public var fields: [String]
    /// When the conflict was found (milliseconds since 1970).
    public var detectedAt: Int64
    /// Why it is open.
    public var reason: ConflictReason = .changed

    public var id: String { "\(table)#\(rowId)" }
}
