/* draft_policy — when a lane drafts and how deep, from what drafting has measured.
 *
 * Depth: a proposal position pays when the chance that it is kept, which needs every position
 * before it kept too, is worth the extra row it costs. The policy keeps, per position i, how
 * often a round reached i (positions 0..i-1 all kept) and how often i was then kept; the chance
 * of keeping positions 0..i is the product of those conditional rates, each with a prior of one
 * kept and one refused round (unmeasured positions count as kept, so a new lane starts at the
 * depth it asked for). The depth is the longest prefix whose
 * chance stays at or above row_cost (a row's cost as a fraction of a step's). A lane held below
 * its asked depth probes one position deeper every DSV4_POLICY_PROBE rounds, so a position that
 * starts paying again is found.
 *
 * Off: no lane drafts while more than busy_max lanes are busy (their rows already fill the
 * step, and verify rows then cost compute, not just a pass over the weights), nor while routed
 * experts are read from host memory (every extra row can route to experts that cross the bus).
 *
 * Drafts never change a token, so these decisions change only the speed. */
#ifndef DSV4_SERVE_DRAFT_POLICY_H
#define DSV4_SERVE_DRAFT_POLICY_H

#include "serve/draft.h"

#define DSV4_POLICY_PROBE 16
#define DSV4_POLICY_ROW_COST 0.15 /* default: a verify row, as a fraction of a decode step */

typedef struct dsv4_draft_policy {
    long reached[DSV4_DRAFT_MAX], kept[DSV4_DRAFT_MAX];
    long rounds;
} dsv4_draft_policy;

/* The depth to propose next (0..max_k): max_k at first, then the longest paying prefix, one
 * deeper on probe rounds. row_cost <= 0 takes the default. */
int dsv4_policy_depth(const dsv4_draft_policy *p, int max_k, double row_cost);
/* Records a round: `proposed` positions offered (0: a round the policy held back, which still
 * counts towards the next probe), the first `kept` of them kept. */
void dsv4_policy_record(dsv4_draft_policy *p, int proposed, int kept);

enum { DSV4_DRAFT_ON = 0, DSV4_DRAFT_OFF_BUSY = 1, DSV4_DRAFT_OFF_HOST_EXPERTS = 2 };
/* Whether lanes draft this step: DSV4_DRAFT_ON, or why not. busy_max <= 0: no bound. */
int dsv4_policy_allow(int busy_lanes, int busy_max, int experts_in_host);

#endif
