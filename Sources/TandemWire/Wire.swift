import Foundation

/// Encoding and decoding of protocol messages: the one place where JSON is read and written.
///
/// Decoding never crashes and never accepts half a message: it returns a whole, validated
/// message or throws a ``WireError`` whose message names the field at fault.
///
/// For example:
///
/// ```swift
/// do {
///     let message = try Wire.decode(ClientMessage.self, from: frame.bytes)
/// } catch {
///     send(.error(error))  // e.g. bad-message: "ops[0].fields: missing"
/// }
/// ```
public enum Wire {
    /// The protocol version of this package.
    public static let protocolVersion = 1

    /// The deepest nesting of arrays and objects accepted in a message. Checked before
    /// decoding, so that a hostile `[[[[…]]]]` cannot exhaust the decoder's stack.
    public static let maxNestingDepth = 64

    private static let encoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.withoutEscapingSlashes]
        return encoder
    }()

    private static let canonicalEncoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.withoutEscapingSlashes, .sortedKeys]
        return encoder
    }()

    private static let decoder = JSONDecoder()

    /// Encodes a message as the UTF-8 bytes of its JSON.
    ///
    /// - Throws: ``WireError`` `.badMessage` when a field holds a number JSON cannot carry
    ///   (infinity or NaN).
    public static func encode(_ message: some Encodable) throws(WireError) -> [UInt8] {
        do {
            return Array(try encoder.encode(message))
        } catch {
            throw WireError(.badMessage, "cannot encode message: \(error)")
        }
    }

    /// Encodes a message as a JSON string.
    public static func encodeString(_ message: some Encodable) throws(WireError) -> String {
        String(decoding: try encode(message), as: UTF8.self)
    }

    /// Encodes document fields with sorted keys: the same fields always give the same bytes.
    public static func encodeCanonical(_ value: some Encodable) throws(WireError) -> [UInt8] {
        do {
            return Array(try canonicalEncoder.encode(value))
        } catch {
            throw WireError(.badMessage, "cannot encode fields: \(error)")
        }
    }

    /// Decodes and validates a message.
    ///
    /// - Throws: ``WireError``: `.badMessage` for anything malformed, `.invalidPath` for a
    ///   collection path or document id that breaks the naming rules. The error carries the
    ///   message's `request` or `target` when they could be read.
    public static func decode<Message: Decodable>(
        _ type: Message.Type, from bytes: some Collection<UInt8>
    ) throws(WireError) -> Message {
        let data = Data(bytes)
        do {
            if let problem = nestingProblem(data) { throw WireError(.badMessage, problem) }
            return try decoder.decode(Message.self, from: data)
        } catch {
            var wireError = Self.describe(error)
            if let envelope = try? decoder.decode(Envelope.self, from: data) {
                wireError.request = wireError.request ?? envelope.request
                wireError.target = wireError.target ?? envelope.target
            }
            throw wireError
        }
    }

    /// Decodes a JSON object of document fields.
    public static func decodeFields(_ bytes: some Collection<UInt8>) throws(WireError) -> JSONObject {
        try decode(JSONObject.self, from: bytes)
    }

    /// What every message may carry to identify itself, read leniently to label errors.
    private struct Envelope: Decodable {
        var request: String?
        var target: String?

        init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            request = try? container.decodeIfPresent(String.self, forKey: .request)
            target = try? container.decodeIfPresent(String.self, forKey: .target)
        }

        private enum CodingKeys: String, CodingKey { case request, target }
    }

    /// Turns a decoding failure into a sentence a person can act on.
    static func describe(_ error: any Error) -> WireError {
        if let error = error as? WireError { return error }
        guard let error = error as? DecodingError else {
            return WireError(.badMessage, "not a valid message: \(error)")
        }
        switch error {
        case .keyNotFound(let key, let context):
            return WireError(.badMessage, "\((context.codingPath + [key]).fieldName): missing")
        case .typeMismatch(let type, let context):
            let field = context.codingPath.isEmpty ? "the message" : context.codingPath.fieldName
            return WireError(.badMessage, "\(field): expected \(jsonTypeName(type))")
        case .valueNotFound(let type, let context):
            let field = context.codingPath.isEmpty ? "the message" : context.codingPath.fieldName
            return WireError(.badMessage, "\(field): expected \(jsonTypeName(type)), found null")
        case .dataCorrupted(let context):
            if context.codingPath.isEmpty {
                return WireError(.badMessage, "not valid JSON: \(context.debugDescription)")
            }
            return WireError(.badMessage, "\(context.codingPath.fieldName): \(context.debugDescription)")
        @unknown default:
            return WireError(.badMessage, "not a valid message: \(error)")
        }
    }

    private static func jsonTypeName(_ type: Any.Type) -> String {
        switch type {
        case is String.Type, is CollectionPath.Type, is DocumentID.Type, is ClientName.Type: "a string"
        case is Int.Type, is Int64.Type: "an integer"
        case is Double.Type: "a number"
        case is Bool.Type: "true or false"
        case is [String: JSONValue].Type, is Dictionary<String, Any>.Type: "an object"
        case is [Any].Type, is [WriteOp].Type, is [Change].Type: "an array"
        default: "an object"
        }
    }

    /// Scans for nesting deeper than ``maxNestingDepth`` without parsing: brackets outside
    /// strings, honouring escapes.
    static func nestingProblem(_ data: Data) -> String? {
        var depth = 0
        var inString = false
        var escaped = false
        for byte in data {
            if inString {
                if escaped {
                    escaped = false
                } else if byte == UInt8(ascii: "\\") {
                    escaped = true
                } else if byte == UInt8(ascii: "\"") {
                    inString = false
                }
                continue
            }
            switch byte {
            case UInt8(ascii: "\""):
                inString = true
            case UInt8(ascii: "["), UInt8(ascii: "{"):
                depth += 1
                if depth > maxNestingDepth {
                    return "JSON nested deeper than \(maxNestingDepth) levels"
                }
            case UInt8(ascii: "]"), UInt8(ascii: "}"):
                depth -= 1
            default:
                break
            }
        }
        return nil
    }
}
