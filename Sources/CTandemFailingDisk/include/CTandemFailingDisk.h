#ifndef TANDEM_CTANDEMFAILINGDISK_H
#define TANDEM_CTANDEMFAILINGDISK_H

/// A SQLite VFS for tests of a disk that fails: it wraps the process's default VFS, becomes
/// the default (databases opened afterwards use it), and passes every call through, except
/// the syncs of one file, which it fails on demand with `SQLITE_IOERR_FSYNC`, as a disk whose
/// `fsync` returns EIO would.
///
/// Installs it once; later calls do nothing. Returns SQLite's result code.
int tandem_failing_disk_install(void);

/// The next `count` syncs of every file whose path ends with `suffix` fail (-1: every one
/// until told otherwise; 0: none, which disarms that suffix). Up to 32 suffixes at once;
/// returns -1 when that many are armed already, 0 otherwise.
int tandem_failing_disk_fail_syncs(const char *suffix, int count);

/// How many syncs of the files armed under `suffix` failed since it was armed (NULL: of every
/// file, since the VFS was installed).
int tandem_failing_disk_failed_syncs(const char *suffix);

#endif
