package charttest

import "os"

func readOperations() ([]byte, error) { return os.ReadFile("../../docs/operations.md") }
