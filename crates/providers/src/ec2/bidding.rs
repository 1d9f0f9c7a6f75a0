//! Bidding: on-demand and spot offers per instance type and zone, spot prices
//! read from EC2, and how reliable each offer has been (interruptions
//! remembered).

use super::*;

/// How long a spot interruption weighs on its offer's reliability.
pub(super) const INTERRUPTION_MEMORY: Duration = Duration::from_secs(3600);

/// At most this many pages of spot prices per refresh (the request budget).
pub(super) const SPOT_PRICE_PAGES: usize = 10;

/// How an instance is bought.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Purchase {
    #[serde(rename = "spot")]
    Spot,
    #[serde(rename = "on-demand")]
    OnDemand,
}

impl Purchase {
    pub const ALL: [Purchase; 2] = [Purchase::Spot, Purchase::OnDemand];
}

impl fmt::Display for Purchase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Purchase::Spot => "spot",
            Purchase::OnDemand => "on-demand",
        })
    }
}

impl FromStr for Purchase {
    type Err = String;
    fn from_str(text: &str) -> Result<Purchase, String> {
        match text {
            "spot" => Ok(Purchase::Spot),
            "on-demand" => Ok(Purchase::OnDemand),
            other => Err(format!("{other:?} is not spot or on-demand")),
        }
    }
}

/// One thing the provider can launch: `TYPE/ZONE/PURCHASE` as an offer key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OfferKey {
    pub instance_type: String,
    pub zone: String,
    pub purchase: Purchase,
}

impl fmt::Display for OfferKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.instance_type, self.zone, self.purchase)
    }
}

impl FromStr for OfferKey {
    type Err = String;
    fn from_str(text: &str) -> Result<OfferKey, String> {
        let mut parts = text.split('/');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(instance_type), Some(zone), Some(purchase), None)
                if !instance_type.is_empty() && !zone.is_empty() =>
            {
                Ok(OfferKey {
                    instance_type: instance_type.to_owned(),
                    zone: zone.to_owned(),
                    purchase: purchase.parse()?,
                })
            }
            _ => Err(format!(
                "{text:?} is not an EC2 offer (INSTANCE_TYPE/ZONE/spot|on-demand)"
            )),
        }
    }
}

/// An offer's reliability after `recent` spot interruptions within the
/// last hour: each halves it, never below 0.05.
pub fn interruption_reliability(recent: usize) -> f64 {
    0.5f64.powi(recent.min(16) as i32).max(0.05)
}

impl Ec2Provider {
    /// Reads the spot prices again when the last read is older than
    /// `spot_price_refresh`; a failed read keeps the prices it had.
    pub(super) async fn refresh_spot_prices(&self) {
        if !self.config.purchase_options.contains(&Purchase::Spot) {
            return;
        }
        let due = self
            .state
            .lock()
            .map(|s| {
                s.prices_read
                    .is_none_or(|at| at.elapsed() >= self.config.spot_price_refresh)
            })
            .unwrap_or(false);
        if !due {
            return;
        }
        if let Ok(mut state) = self.state.lock() {
            // One try per interval, whatever its outcome.
            state.prices_read = Some(Instant::now());
        }
        let client = self.client().await;
        let now = aws_smithy_types_now(self.clock.now());
        let mut request = client
            .describe_spot_price_history()
            .product_descriptions("Linux/UNIX")
            .start_time(now)
            .filters(
                Filter::builder()
                    .name("availability-zone")
                    .set_values(Some(self.config.zones.clone()))
                    .build(),
            );
        for instance_type in &self.config.instance_types {
            request = request.instance_types(InstanceType::from(instance_type.as_str()));
        }
        let mut pages = request.into_paginator().send();
        let mut prices: BTreeMap<(String, String), (f64, i64)> = BTreeMap::new();
        let mut read = 0;
        while let Some(page) = pages.next().await {
            let page = match page {
                Ok(page) => page,
                Err(error) => {
                    let error = self.sdk_error("DescribeSpotPriceHistory", &error);
                    tracing::warn!(provider = %self.config.name, %error, "cannot read spot prices; keeping the last ones");
                    return;
                }
            };
            for price in page.spot_price_history() {
                let (Some(instance_type), Some(zone), Some(value)) = (
                    price.instance_type(),
                    price.availability_zone(),
                    price.spot_price().and_then(|p| p.parse::<f64>().ok()),
                ) else {
                    continue;
                };
                let at = price.timestamp().map(|t| t.secs()).unwrap_or(0);
                let key = (instance_type.as_str().to_owned(), zone.to_owned());
                // The newest price of each (type, zone) holds.
                if prices.get(&key).is_none_or(|(_, seen)| at >= *seen) {
                    prices.insert(key, (value, at));
                }
            }
            read += 1;
            if read >= SPOT_PRICE_PAGES {
                break;
            }
        }
        if let Ok(mut state) = self.state.lock() {
            state.spot_prices = prices.into_iter().map(|(k, (v, _))| (k, v)).collect();
        }
    }

    pub(super) fn reliability(&self, offer: &str, now: Timestamp) -> f64 {
        let recent = self
            .state
            .lock()
            .map(|s| {
                s.interruptions
                    .get(offer)
                    .map(|at| {
                        at.iter()
                            .filter(|t| now.since(**t) < INTERRUPTION_MEMORY)
                            .count()
                    })
                    .unwrap_or(0)
            })
            .unwrap_or(0);
        interruption_reliability(recent)
    }

    /// The spot price of `instance_type` in `zone`, as last read.
    pub fn spot_price(&self, instance_type: &str, zone: &str) -> Option<f64> {
        self.state.lock().ok().and_then(|s| {
            s.spot_prices
                .get(&(instance_type.to_owned(), zone.to_owned()))
                .copied()
        })
    }
}
