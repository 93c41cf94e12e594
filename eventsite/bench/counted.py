"""A psycopg connection that counts the statements sent through it."""


class Counted:
    def __init__(self, conn):
        self.conn = conn
        self.statements = 0

    def execute(self, query, params=None):
        self.statements += 1
        return self.conn.execute(query, params)

    def transaction(self):
        return self.conn.transaction()
