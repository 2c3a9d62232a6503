// A test that imports TandemTesting also gets what its fixtures are made of: local servers and
// devices, the harness (waiting, temporary folders, child processes), the raw WebSocket.
@_exported import TandemHarness
@_exported import TandemLocal
@_exported import TandemSocketTesting
