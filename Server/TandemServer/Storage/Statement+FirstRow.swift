import GRDB

extension Statement {
    /// The first row's values, read by `read` straight from the statement.
    ///
    /// GRDB's `Row.fetchOne` copies every value and every column name before returning; on
    /// the paths that run once per document (looking a row up by its server id) that copy cost
    /// more than the lookup itself. `read` must take out what it needs: the row is only valid
    /// inside it.
    func firstRow<T>(arguments: StatementArguments, _ read: (Row) throws -> T) throws -> T? {
        let rows = try Row.fetchCursor(self, arguments: arguments)
        // The row is valid only while its cursor lives: a released cursor resets the statement.
        return try withExtendedLifetime(rows) { try rows.next().map(read) }
    }
}
