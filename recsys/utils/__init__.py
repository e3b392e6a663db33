"""Small shared utilities: atomic writes, safe loading of files recsys did not write, the one-line refusals,
logging, markdown tables, host memory, string choices."""
