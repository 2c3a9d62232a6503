import TandemWire

/// Failures the server injects on purpose, to test that clients lose nothing when the network
/// or the server misbehaves. Each fault has a probability; all draw from one generator seeded
/// with ``seed``, so a run that failed can be replayed with the same seed (the same decisions
/// for the same sequence of messages).
///
/// For example, a server that loses one acknowledgement in ten:
///
/// ```swift
/// var configuration = ServerConfiguration(dataDirectory: folder)
/// configuration.faults = FaultPlan(seed: 7, lostAckRate: 0.1)
/// ```
///
/// From the command line: `tandem serve --fault-seed 7 --fault-lost-ack 0.1` (see
/// `tandem serve --help`).
public struct FaultPlan: Sendable, Equatable, CustomStringConvertible {
    public var seed: UInt64
    /// Each message received drops its connection (no answer, no close handshake) with this
    /// probability, before it is handled.
    public var dropConnectionRate: Double
    /// Every connection is dropped when it sends its Nth message (before it is handled).
    public var dropConnectionAfter: Int?
    /// Each write is applied and committed, but its acknowledgement is never sent and the
    /// connection is dropped: what a client sees when the network fails between the commit
    /// and the answer.
    public var lostAckRate: Double
    /// Each delivery to a listener holds that connection's outgoing messages (all of them, so
    /// that their order is kept) for ``deliveryDelay``, with this probability.
    public var delayedDeliveryRate: Double
    public var deliveryDelay: Duration
    /// Each write is refused with ``rejectedWriteCode`` without being applied, with this
    /// probability.
    public var rejectedWriteRate: Double
    public var rejectedWriteCode: ErrorCode
    /// Each `listen` is answered with an `internal` error, and not opened, with this
    /// probability: what a client sees when the store fails while reading for a listener.
    public var failedListenRate: Double

    public init(
        seed: UInt64 = 1, dropConnectionRate: Double = 0, dropConnectionAfter: Int? = nil, lostAckRate: Double = 0,
        delayedDeliveryRate: Double = 0, deliveryDelay: Duration = .milliseconds(200), rejectedWriteRate: Double = 0,
        rejectedWriteCode: ErrorCode = .internal, failedListenRate: Double = 0
    ) {
        self.seed = seed
        self.dropConnectionRate = dropConnectionRate
        self.dropConnectionAfter = dropConnectionAfter
        self.lostAckRate = lostAckRate
        self.delayedDeliveryRate = delayedDeliveryRate
        self.deliveryDelay = deliveryDelay
        self.rejectedWriteRate = rejectedWriteRate
        self.rejectedWriteCode = rejectedWriteCode
        self.failedListenRate = failedListenRate
    }

    /// Checks that rates are probabilities and counts are positive.
    func validate() throws(ServerError) {
        let rates = [
            ("dropConnectionRate", dropConnectionRate), ("lostAckRate", lostAckRate),
            ("delayedDeliveryRate", delayedDeliveryRate), ("rejectedWriteRate", rejectedWriteRate),
            ("failedListenRate", failedListenRate),
        ]
        for (name, rate) in rates where !(0...1).contains(rate) {
            throw ServerError(.invalidConfiguration, "fault \(name) must be between 0 and 1, not \(rate)")
        }
        if let after = dropConnectionAfter, after < 1 {
            throw ServerError(.invalidConfiguration, "fault dropConnectionAfter must be at least 1, not \(after)")
        }
        if deliveryDelay < .zero {
            throw ServerError(.invalidConfiguration, "fault deliveryDelay must not be negative")
        }
    }

    public var description: String {
        var parts = ["seed \(seed)"]
        if dropConnectionRate > 0 { parts.append("drop connection \(dropConnectionRate)") }
        if let after = dropConnectionAfter { parts.append("drop connection after \(after) messages") }
        if lostAckRate > 0 { parts.append("lost ack \(lostAckRate)") }
        if delayedDeliveryRate > 0 { parts.append("delayed delivery \(delayedDeliveryRate) by \(deliveryDelay)") }
        if rejectedWriteRate > 0 { parts.append("rejected write \(rejectedWriteRate) with \(rejectedWriteCode)") }
        if failedListenRate > 0 { parts.append("failed listen \(failedListenRate)") }
        return parts.joined(separator: ", ")
    }
}

/// How many faults a server injected.
public struct FaultCounts: Sendable, Equatable {
    public var droppedConnections = 0
    public var lostAcks = 0
    public var delayedDeliveries = 0
    public var rejectedWrites = 0
    public var failedListens = 0
}

/// Draws the plan's decisions. Confined to the server's core queue.
final class FaultInjector {
    let plan: FaultPlan
    private var random: SplitMix64
    var counts = FaultCounts()

    init(_ plan: FaultPlan) {
        self.plan = plan
        random = SplitMix64(seed: plan.seed)
    }

    private func chance(_ rate: Double) -> Bool {
        rate > 0 && Double(random.next() >> 11) / Double(1 << 53) < rate
    }

    /// Whether to drop the connection that sent its `count`th message.
    func dropsConnection(messageCount count: Int) -> Bool {
        let drops = (plan.dropConnectionAfter.map { count >= $0 } ?? false) || chance(plan.dropConnectionRate)
        if drops { counts.droppedConnections += 1 }
        return drops
    }

    func losesAck() -> Bool {
        let loses = chance(plan.lostAckRate)
        if loses { counts.lostAcks += 1 }
        return loses
    }

    func rejectsWrite() -> Bool {
        let rejects = chance(plan.rejectedWriteRate)
        if rejects { counts.rejectedWrites += 1 }
        return rejects
    }

    func failsListen() -> Bool {
        let fails = chance(plan.failedListenRate)
        if fails { counts.failedListens += 1 }
        return fails
    }

    func delaysDelivery() -> Bool {
        let delays = chance(plan.delayedDeliveryRate)
        if delays { counts.delayedDeliveries += 1 }
        return delays
    }
}

/// A small, fast, seedable generator (Steele, Lea and Flood's SplitMix64).
struct SplitMix64: RandomNumberGenerator {
    private var state: UInt64

    init(seed: UInt64) { state = seed }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
