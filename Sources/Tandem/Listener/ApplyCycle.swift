import TandemWire

/// What the listener does with the arrivals it takes from its inbox, as a state machine in
/// the style of the push's ``PushCycle``: each event (what was taken, how an attempt to apply
/// it ended) is a pure transition that returns the next action. ``SyncService`` performs the
/// actions (the ledger's reset, the transactions, the listeners and the pushes that follow);
/// this type does no I/O, so its transitions are unit-tested without sockets or SQLite.
///
/// The cycle: take arrivals → a reset begins, or tokens that moved alone are kept to be stored
/// later, or the snapshots are applied in one transaction → when a change fails, once more with
/// a savepoint per change, so that only the changes that fail are left out → finish: refresh
/// the listeners when parent rows came or went, push what the apply left to push, show the
/// new counts. A failure of the database (not of one change) starts over: the connection goes,
/// since nothing it delivers after may be applied past what failed.
struct ApplyCycle: Equatable {
    /// What was taken from the inbox.
    enum Taken: Equatable {
        /// Nothing of the current connection: arrivals of a connection that is gone are dropped.
        case nothing
        /// A listener's reset: its stored token is no use to the server.
        case reset
        /// Snapshots of one collection; `onlyMoveTokens` when none changes a document.
        case snapshots(onlyMoveTokens: Bool)
    }

    /// How an attempt to apply ended.
    enum Attempt: Equatable {
        /// Committed, with what it did.
        case applied(Summary)
        /// A change's own values were refused (``Reconciler/ChangeFailed``): rolled back.
        case changeFailed
        /// The connection that delivered the snapshots was replaced meanwhile: nothing stored.
        case connectionGone
        /// The database failed (not one change): rolled back.
        case failed
    }

    /// What a committed apply did, as far as what follows it goes.
    struct Summary: Equatable {
        /// Rows of a parent table were inserted or deleted: nested listeners open or close.
        var parentsChanged = false
        /// A conflict settled for the local side, a merge or a filed delete left work to push.
        var leftWorkToPush = false
        /// Nothing changed but resume tokens (echoes of this device's own writes): the counts
        /// stand.
        var changedNothing = false
    }

    /// What the listener does next.
    enum Action: Equatable {
        /// Nothing more.
        case done
        /// Begin the reset in the ledger, dropping the token kept for its collection.
        case beginReset
        /// Keep the tokens, to be stored together later.
        case deferTokens
        /// Apply the snapshots in one transaction, changes as they come.
        case applyTogether
        /// Apply them again, each change in a savepoint of its own.
        case applyIsolating
        /// After a committed apply.
        case finish(refreshListeners: Bool, pushSoon: Bool, refreshStatus: Bool)
        /// Drop the connection; the listeners resume from their stored tokens on the next.
        case startOver
    }

    private enum State: Equatable {
        case idle
        case resetting
        case applying(isolating: Bool)
        case done
    }

    private var state = State.idle
    /// Whether tokens that moved alone may wait (only behind the barrier, where the apply of a
    /// later snapshot and the store of the kept tokens run in order on the sync queue).
    private let defersTokens: Bool

    init(defersTokens: Bool) { self.defersTokens = defersTokens }

    /// The arrivals taken.
    mutating func taken(_ taken: Taken) -> Action {
        precondition(state == .idle, "an apply cycle takes arrivals once")
        switch taken {
        case .nothing:
            state = .done
            return .done
        case .reset:
            state = .resetting
            return .beginReset
        case .snapshots(let onlyMoveTokens):
            if onlyMoveTokens && defersTokens {
                state = .done
                return .deferTokens
            }
            state = .applying(isolating: false)
            return .applyTogether
        }
    }

    /// The reset was begun in the ledger, or the database failed to.
    mutating func resetBegun(_ succeeded: Bool) -> Action {
        precondition(state == .resetting, "no reset was begun")
        state = .done
        return succeeded ? .done : .startOver
    }

    /// An attempt to apply the snapshots ended.
    mutating func attempted(_ attempt: Attempt) -> Action {
        guard case .applying(let isolating) = state else { preconditionFailure("no apply was attempted") }
        switch attempt {
        case .changeFailed where !isolating:
            state = .applying(isolating: true)
            return .applyIsolating
        case .changeFailed, .failed:
            // Isolated, a change's failure is its own and does not end the attempt: one that
            // does is the database's.
            state = .done
            return .startOver
        case .connectionGone:
            state = .done
            return .done
        case .applied(let summary):
            state = .done
            return .finish(
                refreshListeners: summary.parentsChanged, pushSoon: summary.leftWorkToPush,
                refreshStatus: !summary.changedNothing)
        }
    }
}
