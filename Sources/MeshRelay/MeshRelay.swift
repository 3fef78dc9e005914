// MeshRelay's API speaks in MeshPipeline's terms (latency modes, playout statistics): importing MeshRelay brings
// them along, as it did when they lived in MeshAudio.
@_exported import MeshPipeline
