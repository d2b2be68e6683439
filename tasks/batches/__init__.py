"""The Batch API's contract: its tables and ledger writes, chunk messages, progress events, output files, file
expiry."""
