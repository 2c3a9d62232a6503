import TandemWire

/// The export and import format: NDJSON, one JSON object per line.
///
/// The first line names the format; a line per collection gives its feed bounds; then a line
/// per document, tombstones included, by collection and feed order, its fields spliced in as
/// stored:
///
/// ```
/// {"format":"tandem-export","version":1,"epoch":"Xq3…","exportedAt":1763683200000}
/// {"collection":"notes","lastSequence":9,"horizon":0}
/// {"collection":"notes","id":"a1B2…","version":2,"sequence":9,"createTime":…,"updateTime":…,"deleted":false,"fields":{"title":"Rent"},"createKey":"k1","createClient":"device-1"}
/// ```
///
/// An import keeps each document's id, version, times, field times, tombstone and create key;
/// it gives them fresh sequences after the target's own, in the order of the file, since
/// sequences are positions in the target's feed (its listeners hear of the documents as
/// `added`). docs/ADMIN.md describes the format for other tools.
enum ExportFormat {
    static let name = "tandem-export"
    static let version: Int64 = 1

    static func header(epoch: String, at time: Int64) -> [UInt8] {
        var writer = JSONWriter()
        writer.beginObject()
        writer.key("format")
        writer.string(name)
        writer.key("version")
        writer.int(version)
        writer.key("epoch")
        writer.string(epoch)
        writer.key("exportedAt")
        writer.int(time)
        writer.endObject()
        return writer.bytes + [UInt8(ascii: "\n")]
    }

    static func line(_ collection: CollectionPath, _ bounds: FeedBounds) -> [UInt8] {
        var writer = JSONWriter()
        writer.beginObject()
        writer.key("collection")
        writer.string(collection.rawValue)
        writer.key("lastSequence")
        writer.int(bounds.last)
        writer.key("horizon")
        writer.int(bounds.horizon)
        writer.endObject()
        return writer.bytes + [UInt8(ascii: "\n")]
    }

    static func line(_ document: StoredDocument) -> [UInt8] {
        var writer = JSONWriter(capacity: document.fieldsBytes + 256)
        writer.beginObject()
        writer.key("collection")
        writer.string(document.collection.rawValue)
        writer.key("id")
        writer.string(document.id.rawValue)
        writer.key("version")
        writer.int(document.version)
        writer.key("sequence")
        writer.int(document.sequence)
        writer.key("createTime")
        writer.int(document.createTime)
        writer.key("updateTime")
        writer.int(document.updateTime)
        writer.key("deleted")
        writer.bool(document.deleted)
        writer.key("fields")
        writer.raw(Array((document.deleted ? "{}" : document.fieldsJSON).utf8))
        if let key = document.createKey {
            writer.key("createKey")
            writer.string(key)
        }
        if let client = document.createClient {
            writer.key("createClient")
            writer.string(client)
        }
        if let times = document.fieldTimesJSON {
            writer.key("fieldTimes")
            writer.raw(Array(times.utf8))
        }
        writer.endObject()
        return writer.bytes + [UInt8(ascii: "\n")]
    }

    /// The documents of an export, checked, in the order of the file.
    ///
    /// - Throws: ``ImportError`` naming the line and what is wrong with it; nothing is read
    ///   past the first bad line.
    static func parse(_ bytes: [UInt8], maxDocumentBytes: Int) throws(ImportError) -> [StoredDocument] {
        var documents: [StoredDocument] = []
        var seen: [DocumentKey: Int] = [:]
        var sawHeader = false
        var number = 0
        for line in bytes.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false) {
            number += 1
            let line = line.last == UInt8(ascii: "\r") ? line.dropLast() : line
            if line.allSatisfy({ $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\t") }) { continue }
            let object: JSONObject
            do {
                guard case .object(let parsed) = try Wire.parse(line, maxDepth: Wire.maxExportedNestingDepth) else {
                    throw ImportError(line: number, "expected a JSON object")
                }
                object = parsed
            } catch let error as ImportError {
                throw error
            } catch {
                var message = (error as? WireError)?.message ?? "\(error)"
                if message.hasPrefix("JSON nested deeper") {
                    message += " (a document's fields must fit in a write, where they sit two levels deeper)"
                }
                throw ImportError(line: number, message)
            }
            if !sawHeader {
                guard object["format"]?.stringValue == name else {
                    throw ImportError(
                        line: number, #"the first line must be the header {"format":"tandem-export","version":1,…}"#)
                }
                guard object["version"]?.intValue == version else {
                    throw ImportError(
                        line: number,
                        "this server reads version \(version) of the format, not \(object["version"].map(Wire.encodeString) ?? "none")"
                    )
                }
                sawHeader = true
                continue
            }
            if object["lastSequence"] != nil && object["id"] == nil { continue }  // a collection's bounds: advisory
            let document = try Self.document(object, line: number, maxDocumentBytes: maxDocumentBytes)
            if let first = seen.updateValue(number, forKey: document.key) {
                throw ImportError(line: number, "\(document.key) is also on line \(first)")
            }
            documents.append(document)
        }
        guard sawHeader else { throw ImportError(line: 1, "the file is empty: an export starts with its header line") }
        return documents
    }

    private static func document(_ object: JSONObject, line: Int, maxDocumentBytes: Int) throws(ImportError)
        -> StoredDocument
    {
        do {
            guard let path = object["collection"]?.stringValue else {
                throw ImportError(line: line, "collection: expected a string")
            }
            let collection = try CollectionPath(path)
            let document = try Document(json: .object(object), path: "")
            guard document.version >= 1 else {
                throw ImportError(line: line, "version: expected 1 or more, not \(document.version)")
            }
            let fields = String(decoding: Wire.encodeCanonical(document.fields), as: UTF8.self)
            guard fields.utf8.count <= maxDocumentBytes else {
                throw ImportError(
                    line: line, "fields: the document is \(fields.utf8.count) bytes; the limit is \(maxDocumentBytes)")
            }
            var createClient: String?
            if let value = object["createClient"] {
                guard let client = value.stringValue else {
                    throw ImportError(line: line, "createClient: expected a string")
                }
                createClient = client
            }
            return StoredDocument(
                collection: collection, id: document.id, fieldsJSON: document.deleted ? "{}" : fields,
                version: document.version, createTime: document.createTime, updateTime: document.updateTime,
                deleted: document.deleted, sequence: 0, createSequence: 0, createKey: document.createKey,
                createClient: createClient,
                fieldTimesJSON: document.fieldTimes.map { String(decoding: Wire.encodeTimes($0), as: UTF8.self) },
                isNew: true)
        } catch let error as ImportError {
            throw error
        } catch {
            throw ImportError(line: line, (error as? WireError)?.message ?? "\(error)")
        }
    }
}

/// Why an import was refused. Nothing of it was stored.
public struct ImportError: Error, Sendable, CustomStringConvertible {
    public enum Reason: Sendable {
        /// The file is not a valid export (``line`` says where).
        case malformed
        /// A document of the file exists on the server already: an import never overwrites.
        case exists
    }

    public var reason: Reason
    /// The line of the file at fault (1 is the header), or nil when the whole file is.
    public var line: Int?
    public var message: String

    init(line: Int?, _ message: String, reason: Reason = .malformed) {
        self.line = line
        self.message = message
        self.reason = reason
    }

    public var description: String { line.map { "line \($0): \(message)" } ?? message }
}

/// What an import stored.
public struct ImportSummary: Sendable, Equatable {
    public var documents: Int
    public var collections: Int
}
