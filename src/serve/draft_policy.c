/* draft_policy — see draft_policy.h for the rules. */
#include "serve/draft_policy.h"

int dsv4_policy_depth(const dsv4_draft_policy *p, int max_k, double row_cost)
{
    if (max_k > DSV4_DRAFT_MAX)
        max_k = DSV4_DRAFT_MAX;
    if (max_k <= 0)
        return 0;
    if (row_cost <= 0)
        row_cost = DSV4_POLICY_ROW_COST;
    double chance = 1.0;
    int k = 0;
    while (k < max_k) {
        if (p->reached[k] > 0) /* one kept and one refused round of prior: a few rounds do not decide */
            chance *= (double)(p->kept[k] + 1) / (double)(p->reached[k] + 2);
        if (chance < row_cost)
            break;
        k++;
    }
    if (k < max_k && p->rounds > 0 && p->rounds % DSV4_POLICY_PROBE == 0)
        k++;
    return k;
}

void dsv4_policy_record(dsv4_draft_policy *p, int proposed, int kept)
{
    p->rounds++;
    for (int i = 0; i < proposed && i < DSV4_DRAFT_MAX && i <= kept; i++) {
        p->reached[i]++;
        p->kept[i] += i < kept;
    }
}

int dsv4_policy_allow(int busy_lanes, int busy_max, int experts_in_host)
{
    if (experts_in_host)
        return DSV4_DRAFT_OFF_HOST_EXPERTS;
    if (busy_max > 0 && busy_lanes > busy_max)
        return DSV4_DRAFT_OFF_BUSY;
    return DSV4_DRAFT_ON;
}
