"""Where a read is issued: `reader` (BundleReader: direct-I/O reads of sets of neurons into a
preallocated matrix, coalesced, from a thread pool; buffered fallback with page-cache eviction),
`buffers` (page-aligned host buffers and alignment arithmetic) and `fsinfo` (which filesystem a path
is on, to refuse measuring RAM as flash).
"""
