// Package repotest holds checks of the repository itself rather than of a package: that its
// documents and comments stand on their own (they cite no document the repository does not hold,
// and every relative link in its Markdown leads somewhere). It has no code; see its tests.
package repotest
