// A test that imports TandemTesting also gets the scenarios' servers, devices and processes.
@_exported import TandemScenarios
