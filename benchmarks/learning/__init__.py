"""Does training learn: accuracy per sample against TRL, the shipped tool configs before and after."""
