import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL

/// One HTTPS `GET`, for the identity provider's key set: SwiftNIO with its TLS, the system's
/// certificate authorities or one given (`--jwks-ca`). No redirect is followed (an identity
/// provider's `jwks_uri` is its final address), no plain `http://` is spoken, and a body past
/// ``maxBytes`` is refused.
enum HTTPSFetch {
    static let maxBytes = 1 << 20

    struct Response {
        var status: Int
        var headers: HTTPHeaders
        var body: [UInt8]

        /// `Cache-Control: max-age`, when the response has one.
        var maxAge: Duration? {
            for value in headers[canonicalForm: "cache-control"] {
                let directive = value.trimmingCharacters(in: .whitespaces).lowercased()
                if directive.hasPrefix("max-age="), let seconds = Int64(directive.dropFirst("max-age=".count)),
                    seconds >= 0
                {
                    return .seconds(seconds)
                }
            }
            return nil
        }
    }

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    /// Fetches `url` (https only), waiting at most `timeout`. Blocks the calling thread: call it
    /// off every event loop and off the server's queue.
    static func get(_ url: URL, trusting authorityFile: String?, timeout: Duration) throws -> Response {
        guard url.scheme?.lowercased() == "https", let host = url.host, !host.isEmpty else {
            throw Failure(description: "\(url.absoluteString) is not an https:// URL")
        }
        let port = url.port ?? 443
        var target = url.path.isEmpty ? "/" : url.path
        if let query = url.query { target += "?\(query)" }
        var tls = TLSConfiguration.makeClientConfiguration()
        if let authorityFile { tls.trustRoots = .file(authorityFile) }
        let context: NIOSSLContext
        do { context = try NIOSSLContext(configuration: tls) } catch {
            throw Failure(description: "TLS for \(host): \(error)")
        }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { try? group.syncShutdownGracefully() }
        let reader = ResponseReader(promise: group.next().makePromise(of: Response.self))
        let nanoseconds = timeout.components.seconds * 1_000_000_000 + timeout.components.attoseconds / 1_000_000_000
        let bootstrap = ClientBootstrap(group: group)
            .connectTimeout(.nanoseconds(nanoseconds))
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let handler = try NIOSSLClientHandler(
                        context: context, serverHostname: host.first?.isNumber == true ? nil : host)
                    try channel.pipeline.syncOperations.addHandler(handler)
                    try channel.pipeline.syncOperations.addHTTPClientHandlers()
                    try channel.pipeline.syncOperations.addHandler(reader)
                }
            }
        do {
            let channel = try bootstrap.connect(host: host, port: port).wait()
            let timer = channel.eventLoop.scheduleTask(in: .nanoseconds(nanoseconds)) {
                reader.finish(.failure(Failure(description: "no answer from \(host) within \(timeout)")))
                channel.close(promise: nil)
            }
            var head = HTTPRequestHead(version: .http1_1, method: .GET, uri: target)
            head.headers.add(name: "Host", value: url.port.map { "\(host):\($0)" } ?? host)
            head.headers.add(name: "Accept", value: "application/json")
            head.headers.add(name: "Connection", value: "close")
            channel.write(HTTPClientRequestPart.head(head), promise: nil)
            channel.writeAndFlush(HTTPClientRequestPart.end(nil), promise: nil)
            defer {
                timer.cancel()
                channel.close(promise: nil)
            }
            return try reader.promise.futureResult.wait()
        } catch let failure as Failure {
            throw failure
        } catch {
            // Completed before the loop shuts down: a promise left open there is a leak.
            try? reader.promise.futureResult.eventLoop.submit { reader.finish(.failure(error)) }.wait()
            throw Failure(description: "GET \(url.absoluteString): \(error)")
        }
    }

    /// Reads the response; confined to its channel's event loop, where the timeout fires too.
    private final class ResponseReader: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = HTTPClientResponsePart
        let promise: EventLoopPromise<Response>
        private var response: Response?
        private var finished = false

        init(promise: EventLoopPromise<Response>) { self.promise = promise }

        /// Completes the promise once: the first of the end, an error and the timeout wins.
        func finish(_ result: Result<Response, any Error>) {
            guard !finished else { return }
            finished = true
            promise.completeWith(result)
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            switch unwrapInboundIn(data) {
            case .head(let head):
                response = Response(status: Int(head.status.code), headers: head.headers, body: [])
            case .body(let buffer):
                response?.body += buffer.readableBytesView
                if (response?.body.count ?? 0) > HTTPSFetch.maxBytes {
                    finish(.failure(Failure(description: "the answer is over \(HTTPSFetch.maxBytes) bytes")))
                    context.close(promise: nil)
                }
            case .end:
                finish(response.map { .success($0) } ?? .failure(Failure(description: "no response head")))
                context.close(promise: nil)
            }
        }

        func channelInactive(context: ChannelHandlerContext) {
            finish(.failure(Failure(description: "the connection closed before the answer ended")))
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            finish(.failure(Failure(description: "\(error)")))
            context.close(promise: nil)
        }
    }
}
