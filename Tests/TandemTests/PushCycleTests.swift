import Testing

@testable import Tandem
@testable import TandemWire

/// The push cycle's transitions, without a socket or a database: each test plays a push as the
/// ledger and the server would, and checks each step the cycle asks for.
@Suite("The push cycle, as a state machine")
struct PushCycleTests {
    private static let plain = PushCycle.Batch(createsDependedOn: false, reachedEnd: false)
    private static let last = PushCycle.Batch(createsDependedOn: false, reachedEnd: true)
    private static let parents = PushCycle.Batch(createsDependedOn: true, reachedEnd: true)

    /// Plays a batch prepared, sent, and its answer awaited: the steps most tests start with.
    private static func sendAndAwait(_ batch: PushCycle.Batch, on cycle: inout PushCycle, passedOver: Bool = false) {
        let first = cycle.next(localCommitQueued: false)
        #expect(first == .prepare)
        let sent = cycle.prepared(batch, passedOver: passedOver)
        #expect(sent)
        let next = cycle.next(localCommitQueued: false)
        #expect(next == .awaitOldest)
    }

    @Test("an empty ledger: one look, then finished, nothing to await and no push after")
    func nothingToPush() {
        var cycle = PushCycle(depth: 4)
        do {
            let got = cycle.next(localCommitQueued: false)
            #expect(got == .prepare)
        }
        do {
            let got = cycle.prepared(nil, passedOver: false)
            #expect(!got)
        }
        do {
            let got = cycle.next(localCommitQueued: false) == .finish(pushAgain: false)
            #expect(got)
        }
        #expect(!cycle.leavesAnswersUnread)
    }

    @Test("batches go out up to the depth before the oldest answer is awaited, then one more per answer")
    func pipelinesUpToDepth() {
        var cycle = PushCycle(depth: 2)
        do {
            let got = cycle.next(localCommitQueued: false)
            #expect(got == .prepare)
        }
        do {
            let got = cycle.prepared(Self.plain, passedOver: false)
            #expect(got)
        }
        do {
            let got = cycle.next(localCommitQueued: false)
            #expect(got == .prepare)
        }
        do {
            let got = cycle.prepared(Self.plain, passedOver: false)
            #expect(got)
        }
        // Two on their way: wait for the oldest.
        do {
            let got = cycle.next(localCommitQueued: false)
            #expect(got == .awaitOldest)
        }
        #expect(cycle.leavesAnswersUnread)
        do {
            let got = cycle.answered(.acknowledged(creates: 0), batchSize: 10)
            #expect(got == .writeBack)
        }
        // One slot free: prepare the third, which reads to the end.
        do {
            let got = cycle.next(localCommitQueued: false)
            #expect(got == .prepare)
        }
        do {
            let got = cycle.prepared(Self.last, passedOver: false)
            #expect(got)
        }
        do {
            let got = cycle.next(localCommitQueued: false)
            #expect(got == .awaitOldest)
        }
        do {
            let got = cycle.answered(.acknowledged(creates: 0), batchSize: 10)
            #expect(got == .writeBack)
        }
        do {
            let got = cycle.next(localCommitQueued: false)
            #expect(got == .awaitOldest)
        }
        do {
            let got = cycle.answered(.acknowledged(creates: 0), batchSize: 3)
            #expect(got == .writeBack)
        }
        do {
            let got = cycle.next(localCommitQueued: false) == .finish(pushAgain: false)
            #expect(got)
        }
        #expect(!cycle.leavesAnswersUnread)
    }

    @Test("a batch creating rows others depend on is answered before the next is prepared")
    func waitsForParentsIds() {
        var cycle = PushCycle(depth: 4)
        do {
            let got = cycle.next(localCommitQueued: false)
            #expect(got == .prepare)
        }
        do {
            let got = cycle.prepared(Self.parents, passedOver: false)
            #expect(got)
        }
        // Room for three more, but their rows may need the server ids this one brings.
        do {
            let got = cycle.next(localCommitQueued: false)
            #expect(got == .awaitOldest)
        }
        do {
            let got = cycle.answered(.acknowledged(creates: 5), batchSize: 5)
            #expect(got == .writeBack)
        }
        // Though it read to the end, its children were not read: look again.
        do {
            let got = cycle.next(localCommitQueued: false)
            #expect(got == .prepare)
        }
        do {
            let got = cycle.prepared(nil, passedOver: false)
            #expect(!got)
        }
        do {
            let got = cycle.next(localCommitQueued: false) == .finish(pushAgain: false)
            #expect(got)
        }
    }

    @Test("a batch that read to the end stops the preparing, unless a local commit queued another push")
    func localCommitReopens() {
        var cycle = PushCycle(depth: 4)
        do {
            let got = cycle.next(localCommitQueued: false)
            #expect(got == .prepare)
        }
        do {
            let got = cycle.prepared(Self.last, passedOver: false)
            #expect(got)
        }
        do {
            let got = cycle.next(localCommitQueued: false)
            #expect(got == .awaitOldest)
        }
        do {
            let got = cycle.answered(.acknowledged(creates: 0), batchSize: 1)
            #expect(got == .writeBack)
        }
        // The app committed meanwhile: its rows go out in this push.
        do {
            let got = cycle.next(localCommitQueued: true)
            #expect(got == .prepare)
        }
        do {
            let got = cycle.prepared(Self.last, passedOver: false)
            #expect(got)
        }
        do {
            let got = cycle.next(localCommitQueued: false)
            #expect(got == .awaitOldest)
        }
    }

    @Test("a local commit reopens the preparing only once an answer was settled, not while the batch is on its way")
    func localCommitWaitsForAnAnswer() {
        var cycle = PushCycle(depth: 4)
        _ = cycle.next(localCommitQueued: false)
        _ = cycle.prepared(Self.last, passedOver: false)
        do {
            let got = cycle.next(localCommitQueued: true)
            #expect(got == .awaitOldest)
        }
    }

    @Test("after the most batches one push may send, it stops preparing and asks for another push")
    func boundedLength() {
        var cycle = PushCycle(depth: 1, maxBatches: 3)
        for _ in 0..<3 {
            do {
                let got = cycle.next(localCommitQueued: false)
                #expect(got == .prepare)
            }
            do {
                let got = cycle.prepared(Self.plain, passedOver: false)
                #expect(got)
            }
            do {
                let got = cycle.next(localCommitQueued: false)
                #expect(got == .awaitOldest)
            }
            do {
                let got = cycle.answered(.acknowledged(creates: 0), batchSize: 100)
                #expect(got == .writeBack)
            }
        }
        do {
            let got = cycle.next(localCommitQueued: false) == .finish(pushAgain: true)
            #expect(got)
        }
    }

    @Test("rows passed over go out in another push only when creates were acknowledged that can help them")
    func passedOverRows() {
        var helped = PushCycle(depth: 1)
        Self.sendAndAwait(Self.last, on: &helped, passedOver: true)
        _ = helped.answered(.acknowledged(creates: 2), batchSize: 2)
        do {
            let got = helped.next(localCommitQueued: false) == .finish(pushAgain: true)
            #expect(got)
        }

        var unhelped = PushCycle(depth: 1)
        Self.sendAndAwait(Self.last, on: &unhelped, passedOver: true)
        _ = unhelped.answered(.acknowledged(creates: 0), batchSize: 2)
        do {
            let got = unhelped.next(localCommitQueued: false) == .finish(pushAgain: false)
            #expect(got)
        }
    }

    @Test("a conflict or an op refused alone settles that op and leaves the others to another push")
    func oneOpSettled() {
        var cycle = PushCycle(depth: 1)
        Self.sendAndAwait(Self.plain, on: &cycle)
        do {
            let got = cycle.answered(.conflict(op: 1), batchSize: 3) == .resolveConflict(op: 1)
            #expect(got)
        }
        Self.sendAndAwait(Self.plain, on: &cycle)
        do {
            let got = cycle.answered(.refused(.notFound, op: 0), batchSize: 3) == .refuseOne(op: 0, .notFound)
            #expect(got)
        }
        Self.sendAndAwait(Self.plain, on: &cycle)
        do {
            let got = cycle.answered(.refused(.permissionDenied, op: 2), batchSize: 3) == .refuseOne(op: 2, .reject)
            #expect(got)
        }
        Self.sendAndAwait(Self.last, on: &cycle)
        do {
            let got = cycle.answered(.refused(.rateLimited, op: 2), batchSize: 3) == .refuseOne(op: 2, .countAttempt)
            #expect(got)
        }
        do {
            let got = cycle.next(localCommitQueued: false) == .finish(pushAgain: true)
            #expect(got)
        }
    }

    @Test("an op index outside the batch is not taken for the batch's own")
    func opOutsideTheBatch() {
        var cycle = PushCycle(depth: 1)
        Self.sendAndAwait(Self.last, on: &cycle)
        do {
            let got = cycle.answered(.refused(.permissionDenied, op: 7), batchSize: 3)
            #expect(got == .rejectAll)
        }
    }

    @Test("a rejection of the whole batch fails its rows and the push goes on")
    func wholeBatchRejected() {
        var cycle = PushCycle(depth: 1)
        Self.sendAndAwait(Self.last, on: &cycle)
        do {
            let got = cycle.answered(.refused(.tooLarge, op: nil), batchSize: 3)
            #expect(got == .rejectAll)
        }
        do {
            let got = cycle.next(localCommitQueued: false) == .finish(pushAgain: false)
            #expect(got)
        }
    }

    @Test("a passing server error stops the push and counts an attempt; the server's answer leaves nothing unread")
    func passingServerError() {
        var cycle = PushCycle(depth: 2)
        _ = cycle.next(localCommitQueued: false)
        _ = cycle.prepared(Self.plain, passedOver: false)
        do {
            let got = cycle.next(localCommitQueued: false)
            #expect(got == .prepare)
        }
        _ = cycle.prepared(Self.last, passedOver: false)
        do {
            let got = cycle.next(localCommitQueued: false)
            #expect(got == .awaitOldest)
        }
        do {
            let got =
                cycle.answered(.refused(.internal, op: nil), batchSize: 3)
                == .stop(countsAttempt: true, resendSoon: false)
            #expect(got)
        }
        // The second batch is still on its way: the connection must go.
        #expect(cycle.leavesAnswersUnread)

        var alone = PushCycle(depth: 1)
        Self.sendAndAwait(Self.last, on: &alone)
        _ = alone.answered(.refused(.internal, op: nil), batchSize: 3)
        #expect(!alone.leavesAnswersUnread)
    }

    @Test("an outcome the server does not know is resent soon under the same keys, not counted as an attempt")
    func outcomeUnknown() {
        var cycle = PushCycle(depth: 1)
        Self.sendAndAwait(Self.last, on: &cycle)
        do {
            let got =
                cycle.answered(.refused(.outcomeUnknown, op: nil), batchSize: 1)
                == .stop(countsAttempt: false, resendSoon: true)
            #expect(got)
        }
        #expect(!cycle.leavesAnswersUnread)
    }

    @Test("a lost answer stops the push with the answer unread: the connection must go")
    func lostAnswer() {
        var cycle = PushCycle(depth: 1)
        Self.sendAndAwait(Self.last, on: &cycle)
        do {
            let got = cycle.answered(.lost, batchSize: 1) == .stop(countsAttempt: true, resendSoon: false)
            #expect(got)
        }
        #expect(cycle.leavesAnswersUnread)
    }

    @Test("an acknowledgement whose write-back fails leaves the answer unsettled: the connection must go")
    func writeBackFails() {
        var cycle = PushCycle(depth: 1)
        Self.sendAndAwait(Self.last, on: &cycle)
        _ = cycle.answered(.acknowledged(creates: 1), batchSize: 1)
        // The push throws here, before its next step.
        #expect(cycle.leavesAnswersUnread)
    }
}
