"""A bank account aggregate: pure state and handlers, no I/O."""

from __future__ import annotations

from pydantic import BaseModel, PositiveInt

from docoutbox import Aggregate, Decision, Handlers, Message, emit


class Account(Aggregate):
    owner: str = ""
    balance: int = 0


class Amount(BaseModel):
    amount: PositiveInt


handlers: Handlers[Account] = Handlers()


@handlers.on("Deposit")
def deposit(account: Account, message: Message) -> Decision[Account]:
    body = message.payload_as(Amount)
    new = account.model_copy(update={"balance": account.balance + body.amount})
    return Decision(new, emit("Deposited", body, destination="ledger"))


@handlers.on("Withdraw")
def withdraw(account: Account, message: Message) -> Decision[Account]:
    body = message.payload_as(Amount)
    if body.amount > account.balance:
        return Decision(account, emit("WithdrawalRejected", body, destination="ledger"))
    new = account.model_copy(update={"balance": account.balance - body.amount})
    return Decision(new, emit("Withdrawn", body, destination="ledger"))


class Ledger(Aggregate):
    """A consumer: totals what the accounts report, exactly once per message."""

    deposited: int = 0
    withdrawn: int = 0
    rejected: int = 0


ledger_handlers: Handlers[Ledger] = Handlers()


@ledger_handlers.on("Deposited", "Withdrawn", "WithdrawalRejected")
def record(ledger: Ledger, message: Message) -> Ledger:
    amount = message.payload_as(Amount).amount
    field = {"Deposited": "deposited", "Withdrawn": "withdrawn"}.get(message.type, "rejected")
    return ledger.model_copy(update={field: getattr(ledger, field) + amount})
