import Foundation
import Synchronization

/// A folder under the system's temporary directory, removed when this object goes away.
///
/// For example:
///
/// ```swift
/// let folder = try TemporaryDirectory()
/// let databaseURL = folder.url.appendingPathComponent("device.sqlite")
/// ```
public final class TemporaryDirectory: Sendable {
    public let url: URL
    private let removesWhenDone: Bool
    private let kept = Atomic<Bool>(false)

    public init(prefix: String = "tandem") throws {
        url = FileManager.default.temporaryDirectory
            .appendingPathComponent("\(prefix)-\(UUID().uuidString.prefix(8))", isDirectory: true)
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        removesWhenDone = true
    }

    /// A folder someone else owns (another process's, say): created when missing, never removed.
    public init(borrowing url: URL) throws {
        self.url = url
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        removesWhenDone = false
    }

    deinit {
        if removesWhenDone && !kept.load(ordering: .relaxed) { try? FileManager.default.removeItem(at: url) }
    }

    /// Leaves the folder in place when this object goes (a failed run's evidence).
    public func keep() {
        kept.store(true, ordering: .relaxed)
    }

    /// A path inside the folder.
    public func path(_ name: String) -> String {
        url.appendingPathComponent(name).path
    }
}
