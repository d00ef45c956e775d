// Package layering has no code: its test holds the module's import rules (which package may
// import which) and the rule that a function's main only wires, and fails on any break of
// them. It reads the module's source files, so it needs no build and no AWS.
package layering
