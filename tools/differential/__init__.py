"""The differential test of edged's shortcuts (issue 49; DESIGN.md, "Shortcuts answer exactly
what the full path would"): a seeded generator of request sequences (`scenario`) is played
against two daemons on the same models, one with every shortcut on and one with
`api.shortcuts: []` (`play`), and every answer of the first is compared with the second's.

What varies: JSON in UTF-8 and not, binary tensors, raw binary bodies, gzip and deflate (some
as long as their inflated bytes), chunked bodies, heads and bodies in one write or two,
header spellings, repeats on one connection (replays) and on others (plans), pipelining,
shared memory inputs and outputs, several connections at once, several uids (a peer process
per uid), bad requests of every kind; and between requests, shared memory writes, registers
and unregisters, model swaps by signed OTA installs (inputs changed or not), unloads and loads.

`python -m tools.bench differential --minutes N` runs it for N minutes and reports requests
compared and mismatches; tests/integration/test_differential.py runs a fixed seed in CI."""
