package dynamo

// SetOperationsPage sets the byState page size for a test and returns the restore.
func SetOperationsPage(n int) (restore func()) {
	old := operationsPage
	operationsPage = n
	return func() { operationsPage = old }
}
