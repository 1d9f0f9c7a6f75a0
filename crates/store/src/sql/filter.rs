//! A statement with optional conditions, written without a query builder.

/// A query with optional conditions, each with the next `$n` parameter:
/// the caller binds the present ones in the order they were added.
/// (sqlx's `QueryBuilder` does the same, but its borrow of the builder
/// cannot be proven to end in code generic over the database.)
pub(super) struct Filter {
    pub(super) text: String,
    pub(super) parameters: usize,
}

impl Filter {
    pub(super) fn new(text: String) -> Filter {
        Filter {
            text,
            parameters: 0,
        }
    }

    /// Adds ` AND {condition} $n` when `present`.
    pub(super) fn and_if(&mut self, present: bool, condition: &str) -> &mut Filter {
        if present {
            self.parameters += 1;
            self.text += &format!(" AND {condition} ${}", self.parameters);
        }
        self
    }

    pub(super) fn then(&mut self, text: &str) -> &mut Filter {
        self.text += text;
        self
    }

    /// Adds `{clause} $n` when `present`.
    pub(super) fn then_if(&mut self, present: bool, clause: &str) -> &mut Filter {
        if present {
            self.parameters += 1;
            self.text += &format!("{clause} ${}", self.parameters);
        }
        self
    }
}
