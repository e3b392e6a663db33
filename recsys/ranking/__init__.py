"""The ranking layer every ranker and the evaluation stage share: interactions as CSR, exact and device top-k with
their ties, the metrics, the two-tower's users embedded and scored across ranks, and the items it never trained. It
imports no ranker; rankers/ stand on it, and the evaluation stage and its report on both."""
