import Foundation

/// The `tandem` executable running now, for commands that start more of it (the soak's and the
/// benchmarks' servers).
///
/// Not `CommandLine.arguments[0]`: started by name from `PATH`, that is just `tandem`, which
/// resolves against the current folder. The kernel knows the real file.
public enum Executable {
    public static var current: URL {
        #if os(Linux)
            if let path = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") {
                return URL(fileURLWithPath: path)
            }
        #endif
        if let url = Bundle.main.executableURL { return url.resolvingSymlinksInPath() }
        let name = CommandLine.arguments[0]
        if !name.contains("/") {
            let folders = (ProcessInfo.processInfo.environment["PATH"] ?? "").split(separator: ":")
            for folder in folders {
                let candidate = URL(fileURLWithPath: String(folder)).appendingPathComponent(name)
                if FileManager.default.isExecutableFile(atPath: candidate.path) {
                    return candidate.resolvingSymlinksInPath()
                }
            }
        }
        return URL(fileURLWithPath: name).resolvingSymlinksInPath()
    }
}
