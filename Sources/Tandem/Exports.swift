// An app that imports Tandem also gets the protocol client it is built on: `TandemError`,
// `ServerConnection`.
@_exported import TandemClient
