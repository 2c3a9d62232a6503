/// Rows written or read many per statement (`INSERT … VALUES (…), (…)`, `UPDATE … FROM
/// (VALUES …)`, `WHERE key IN (…)`).
///
/// One statement of many rows costs SQLite far less a row than one statement each: the
/// statement's own start and end (its cursors, its transaction step, `sqlite_sequence` for an
/// `AUTOINCREMENT` table), and, on a table with triggers, the statement journal that copies
/// each page the statement changes, are paid once for all of its rows.
package enum StatementRows {
    /// How rows are cut into groups of 64, 16, 4 or 1, so that a statement needs at most four
    /// forms compiled, whatever the count. 64 rows of up to 15 values stay within the 999
    /// bound values of SQLite before 3.32.
    package static func groups(of indices: Range<Int>) -> [Range<Int>] {
        var groups: [Range<Int>] = []
        var start = indices.lowerBound
        while start < indices.upperBound {
            let left = indices.upperBound - start
            let size = left >= 64 ? 64 : left >= 16 ? 16 : left >= 4 ? 4 : 1
            groups.append(start..<start + size)
            start += size
        }
        return groups
    }

    /// The sizes ``groups(of:)`` makes.
    package static let groupSizes = [1, 4, 16, 64]

    /// `(?, ?), (?, ?)` for two rows of two columns.
    package static func placeholders(rows: Int, columns: Int) -> String {
        let row = "(" + Array(repeating: "?", count: columns).joined(separator: ", ") + ")"
        return Array(repeating: row, count: rows).joined(separator: ", ")
    }
}
