import Testing

@testable import Tandem

/// The listener's apply cycle, without a socket or a database.
@Suite("The apply cycle, as a state machine")
struct ApplyCycleTests {
    @Test("arrivals of a connection that is gone: nothing is done")
    func nothingTaken() {
        var cycle = ApplyCycle(defersTokens: true)
        do {
            let got = cycle.taken(.nothing)
            #expect(got == .done)
        }
    }

    @Test("a reset begins in the ledger; a database that fails to begin it starts over")
    func reset() {
        var begun = ApplyCycle(defersTokens: true)
        do {
            let got = begun.taken(.reset)
            #expect(got == .beginReset)
        }
        do {
            let got = begun.resetBegun(true)
            #expect(got == .done)
        }

        var failed = ApplyCycle(defersTokens: true)
        do {
            let got = failed.taken(.reset)
            #expect(got == .beginReset)
        }
        do {
            let got = failed.resetBegun(false)
            #expect(got == .startOver)
        }
    }

    @Test("tokens that moved alone wait to be stored together behind the barrier, and are applied at once without it")
    func tokensAlone() {
        var barrier = ApplyCycle(defersTokens: true)
        do {
            let got = barrier.taken(.snapshots(onlyMoveTokens: true))
            #expect(got == .deferTokens)
        }

        var unserialized = ApplyCycle(defersTokens: false)
        do {
            let got = unserialized.taken(.snapshots(onlyMoveTokens: true))
            #expect(got == .applyTogether)
        }
    }

    @Test(
        "a committed apply refreshes the listeners only when parent rows came or went, pushes what it left, and reads the counts only when something changed"
    )
    func finish() {
        var echo = ApplyCycle(defersTokens: true)
        do {
            let got = echo.taken(.snapshots(onlyMoveTokens: false))
            #expect(got == .applyTogether)
        }
        do {
            let got = echo.attempted(.applied(.init(changedNothing: true)))
            #expect(got == .finish(refreshListeners: false, pushSoon: false, refreshStatus: false))
        }

        var parents = ApplyCycle(defersTokens: true)
        _ = parents.taken(.snapshots(onlyMoveTokens: false))
        do {
            let got = parents.attempted(.applied(.init(parentsChanged: true, leftWorkToPush: true)))
            #expect(got == .finish(refreshListeners: true, pushSoon: true, refreshStatus: true))
        }
    }

    @Test("a change that fails is isolated: the snapshots are applied again, a savepoint per change")
    func changeFailed() {
        var cycle = ApplyCycle(defersTokens: true)
        _ = cycle.taken(.snapshots(onlyMoveTokens: false))
        do {
            let got = cycle.attempted(.changeFailed)
            #expect(got == .applyIsolating)
        }
        do {
            let got = cycle.attempted(.applied(.init()))
            #expect(got == .finish(refreshListeners: false, pushSoon: false, refreshStatus: true))
        }
    }

    @Test("a failure that isolating changes does not contain, or one of the database, starts over")
    func startsOver() {
        var twice = ApplyCycle(defersTokens: true)
        _ = twice.taken(.snapshots(onlyMoveTokens: false))
        _ = twice.attempted(.changeFailed)
        do {
            let got = twice.attempted(.changeFailed)
            #expect(got == .startOver)
        }

        var database = ApplyCycle(defersTokens: true)
        _ = database.taken(.snapshots(onlyMoveTokens: false))
        do {
            let got = database.attempted(.failed)
            #expect(got == .startOver)
        }
    }

    @Test("a connection replaced while the apply ran: nothing stored, nothing more done")
    func connectionGone() {
        var cycle = ApplyCycle(defersTokens: true)
        _ = cycle.taken(.snapshots(onlyMoveTokens: false))
        do {
            let got = cycle.attempted(.connectionGone)
            #expect(got == .done)
        }
    }
}
