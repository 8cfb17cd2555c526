"""SQL text: parsing (`parse`, sqlglot) and quoting (`text`)."""
