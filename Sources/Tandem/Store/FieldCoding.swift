import Foundation
import GRDB
import TandemWire

/// Converts SQLite values to JSON document fields and back.
///
/// Integers, reals, text and NULL map to their JSON counterparts. A blob becomes
/// `{"$blob": "<base64>"}`, so that it comes back as a blob. A JSON array or object that is not
/// a blob (written by another client) is stored as its JSON text.
enum FieldCoding {
    /// - Parameter isJSON: The column holds JSON text (``SyncTable/storingJSON(_:)``): text
    ///   that parses goes as that JSON.
    static func json(_ value: DatabaseValue, isJSON: Bool = false) -> JSONValue {
        switch value.storage {
        case .null: .null
        case .int64(let int): .int(int)
        case .double(let double): double.isFinite ? .double(double) : .null
        case .string(let string):
            if isJSON, let parsed = try? Wire.parse(Array(string.utf8)) { parsed } else { .string(string) }
        case .blob(let data): .object(["$blob": .string(data.base64EncodedString())])
        }
    }

    static func database(_ value: JSONValue) -> DatabaseValue {
        switch value {
        case .null: .null
        case .bool(let bool): bool.databaseValue
        case .int(let int): int.databaseValue
        case .double(let double): double.databaseValue
        case .string(let string): string.databaseValue
        case .object(let object):
            if object.count == 1, let base64 = object["$blob"]?.stringValue, let data = Data(base64Encoded: base64) {
                data.databaseValue
            } else {
                jsonText(value)
            }
        case .array: jsonText(value)
        }
    }

    private static func jsonText(_ value: JSONValue) -> DatabaseValue {
        String(decoding: Wire.encodeCanonical(value), as: UTF8.self).databaseValue
    }
}
