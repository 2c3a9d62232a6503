import CTandemFailingDisk
import Foundation

/// A disk whose `fsync` fails on demand, for tests of what a server or a device does when
/// SQLite cannot make a commit durable.
///
/// It is a SQLite VFS that wraps the default one and becomes the default for every database
/// opened afterwards in the process; it passes everything through but the syncs of the files
/// a test names, which fail with `SQLITE_IOERR_FSYNC`, as `fsync` failing with EIO would.
///
/// For example, the next sync of a test server's log fails:
///
/// ```swift
/// FailingDisk.install()
/// let server = try await TestServer()
/// FailingDisk.failSyncs(ofFileEndingWith: FailingDisk.log(of: server))
/// ```
public enum FailingDisk {
    /// Installs the VFS (once). Call it before the databases it should reach are opened.
    public static func install() {
        let code = tandem_failing_disk_install()
        precondition(code == 0, "the failing disk's VFS could not be installed: SQLite result code \(code)")
    }

    /// The next `count` syncs (nil: every one) of each file whose path ends with `suffix` fail.
    /// Each suffix is armed on its own, so that tests running side by side do not disturb each
    /// other.
    public static func failSyncs(ofFileEndingWith suffix: String, count: Int? = 1) {
        let armed = tandem_failing_disk_fail_syncs(suffix, Int32(count ?? -1))
        precondition(armed == 0, "the failing disk holds 32 armed files already; heal some first")
    }

    /// The syncs of the files ending with `suffix` go through again.
    public static func heal(_ suffix: String) {
        _ = tandem_failing_disk_fail_syncs(suffix, 0)
    }

    /// How many syncs of the files armed under `suffix` failed since it was armed.
    public static func failedSyncs(ofFileEndingWith suffix: String) -> Int {
        Int(tandem_failing_disk_failed_syncs(suffix))
    }

    /// The suffix that names the write-ahead log of a test server's SQLite store.
    public static func log(of server: TestServer) -> String {
        server.directory.url.lastPathComponent + "/tandem.sqlite-wal"
    }
}
