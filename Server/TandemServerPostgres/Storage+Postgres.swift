import TandemServer

extension ServerConfiguration.Storage {
    /// A PostgreSQL database, shared by every server node given the same URL, like
    /// `postgresql://tandem@/tandem?host=/run/postgresql&port=5432`.
    ///
    /// It comes from this target, `TandemServerPostgres`, so that an app that embeds the SQLite
    /// server links no libpq; `tandem serve --postgres URL` uses it.
    public static func postgres(url: String) -> Self {
        .external(
            StoreFactory(kind: "postgres", summary: "PostgreSQL at \(withoutPassword(url))") { context in
                try PostgresStore(
                    url: url, logger: context.logger, timeout: context.timeout, onNews: context.onNews,
                    onReachability: context.onReachability)
            })
    }
}
